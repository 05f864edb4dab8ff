"""Benchmark: the ``tflite`` backend against a plain LiteRT interpreter, same model, same threads.

The baseline is what a user would write: ``Interpreter(model_path, num_threads)``,
``set_tensor`` / ``invoke`` / ``get_tensor``. Both run the same inputs in
alternating blocks (so machine noise hits both alike) until ``--runs`` runs
each or ``--seconds`` per model, whichever comes first. Prints JSON with
per-model medians and ``ratio`` = ours / plain (1.05 = 5 % overhead), next
to ``control_ratio``: a second plain interpreter / plain, the noise floor.

Models: the generated float and int8 CNNs, every ``--model`` path, and the
mediapipe models found in ``--mediapipe`` (a 0.10.x wheel, a folder of
wheels, or a folder of ``.tflite`` files).

A two-op model measures the fixed per-call overhead (``per_call_overhead_us``).

Usage: ``python tools/bench_tflite.py --mediapipe WHEEL --threads 1 --plot bench_tflite.png``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

MEDIAPIPE_MODELS = ("face_detection_short_range.tflite", "face_landmark.tflite", "iris_landmark.tflite",
                    "selfie_segmentation.tflite")
BLOCK_RUNS = 5


def _feeds(details: list[dict[str, Any]], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for d in details:
        dtype = np.dtype(d["dtype"])
        if dtype.kind == "f":
            feeds[d["name"]] = rng.uniform(-1, 1, size=d["shape"]).astype(dtype)
        else:
            info = np.iinfo(dtype)
            feeds[d["name"]] = rng.integers(info.min, info.max, size=d["shape"], endpoint=True).astype(dtype)
    return feeds


def _plain_runner(model: Path, threads: int) -> tuple[Callable[[], object], dict[str, np.ndarray]]:
    from backends.tflite.runtime import interpreter_module

    interpreter = interpreter_module().Interpreter(model_path=str(model), num_threads=threads)
    interpreter.allocate_tensors()
    inputs, outputs = interpreter.get_input_details(), interpreter.get_output_details()
    feeds = _feeds(inputs, 0)

    def run() -> object:
        for d in inputs:
            interpreter.set_tensor(d["index"], feeds[d["name"]])
        interpreter.invoke()
        return [interpreter.get_tensor(d["index"]) for d in outputs]

    return run, feeds


def bench_model(model: Path, threads: int, runs: int, seconds: float) -> dict[str, Any]:
    """Latencies (ms) of plain LiteRT, a second plain interpreter (control) and our executable.

    Sides run in alternating blocks; a ratio is the median over rounds of
    (block median / plain block median), so blocks that ran back to back are
    compared and slow drifts of a shared machine cancel. ``control_ratio``
    (a second, identical plain interpreter) shows the noise floor of the run.
    """
    from backends.base import CompileOptions
    from backends.tflite import TFLiteBackend

    plain, feeds = _plain_runner(model, threads)
    control, _ = _plain_runner(model, threads)
    executable = TFLiteBackend().compile(model, CompileOptions(intra_op_threads=threads))
    sides: dict[str, Callable[[], object]] = {"plain": plain, "control": control,
                                               "ours": lambda: executable.run(feeds)}
    for run in sides.values():  # warm-up: first invokes pay for allocation and weight packing
        for _ in range(3):
            run()
    times: dict[str, list[float]] = {name: [] for name in sides}
    ratios: dict[str, list[float]] = {"ours": [], "control": []}
    deadline = time.perf_counter() + seconds
    while len(times["ours"]) < runs and time.perf_counter() < deadline:
        order = list(sides) if len(ratios["ours"]) % 2 == 0 else list(reversed(sides))
        block: dict[str, float] = {}
        for name in order:
            elapsed = []
            for _ in range(BLOCK_RUNS):
                start = time.perf_counter_ns()
                sides[name]()
                elapsed.append((time.perf_counter_ns() - start) / 1e6)
            times[name] += elapsed
            block[name] = float(np.median(elapsed))
        for name in ratios:
            ratios[name].append(block[name] / block["plain"])
    executable.close()
    p50 = {name: float(np.median(values)) for name, values in times.items()}
    return {"model": model.name, "bytes": model.stat().st_size, "threads": threads, "runs": len(times["ours"]),
            "plain_ms_p50": round(p50["plain"], 4), "ours_ms_p50": round(p50["ours"], 4),
            "plain_ms_p90": round(float(np.percentile(times["plain"], 90)), 4),
            "ours_ms_p90": round(float(np.percentile(times["ours"], 90)), 4),
            "ratio": round(float(np.median(ratios["ours"])), 4),
            "control_ratio": round(float(np.median(ratios["control"])), 4),
            "overhead_us": round((p50["ours"] - p50["plain"]) * 1000, 2)}


def _mediapipe_models(source: Path, out: Path) -> list[Path]:
    if source.is_dir() and any(source.glob("*.tflite")):
        return [source / name for name in MEDIAPIPE_MODELS if (source / name).is_file()]
    found = []
    for wheel in sorted(source.glob("mediapipe-*.whl")) if source.is_dir() else [source]:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                name = member.rsplit("/", 1)[-1]
                if name in MEDIAPIPE_MODELS and not (out / name).exists():
                    (out / name).write_bytes(archive.read(member))
                    found.append(out / name)
    return found


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["model"].removesuffix(".tflite") for r in results]
    x = np.arange(len(results))
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(results)), 4))
    ax.bar(x - 0.2, [r["plain_ms_p50"] for r in results], 0.4, label="plain LiteRT")
    ax.bar(x + 0.2, [r["ours_ms_p50"] for r in results], 0.4, label="edge-runtime tflite")
    for i, r in enumerate(results):
        ax.annotate(f"x{r['ratio']:.3f}", (i, max(r["plain_ms_p50"], r["ours_ms_p50"])), ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(x, names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("median latency (ms)")
    ax.set_title(f"tflite backend vs plain LiteRT ({results[0]['threads']} threads)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, action="append", default=[], help="a .tflite file (repeatable)")
    parser.add_argument("--mediapipe", type=Path, help="mediapipe 0.10.x wheel, or folder of wheels/.tflite")
    parser.add_argument("--threads", type=int, default=1, help="interpreter threads, both sides")
    parser.add_argument("--runs", type=int, default=300, help="runs per side and model (at most)")
    parser.add_argument("--seconds", type=float, default=15.0, help="time budget per model")
    parser.add_argument("--plot", type=Path, help="write a PNG bar chart here")
    parser.add_argument("--no-generated", action="store_true", help="skip the generated CNNs")
    args = parser.parse_args(argv)

    import make_tflite_models

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        models = list(args.model)
        if not args.no_generated:
            for name, make in (("float_cnn_224.tflite", lambda: make_tflite_models.float_cnn(size=224)),
                               ("int8_cnn_224.tflite", lambda: make_tflite_models.quantized_cnn(size=224))):
                (work / name).write_bytes(make())
                models.append(work / name)
        if args.mediapipe:
            models += _mediapipe_models(args.mediapipe, work)
        results = [bench_model(model, args.threads, args.runs, args.seconds) for model in models]
        # A two-op model: its latency is almost all per-call overhead, on both sides.
        (work / "tiny_add_mul.tflite").write_bytes(make_tflite_models.two_signature_model())
        probe = bench_model(work / "tiny_add_mul.tflite", args.threads, args.runs, args.seconds)
    ratios = [r["ratio"] for r in results]
    report = {"benchmark": "tflite backend vs plain LiteRT", "threads": args.threads, "results": results,
              "ratio_median": round(float(np.median(ratios)), 4) if ratios else None,
              "ratio_max": max(ratios, default=None),
              "per_call_overhead_us": probe["overhead_us"], "overhead_probe": probe}
    if args.plot and results:
        _plot(results, args.plot)
        report["plot"] = str(args.plot)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
