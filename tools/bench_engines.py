"""Benchmark: CPU engines per model — plain ONNX Runtime, our ``cpu``, ``ncnn`` (CPU and Vulkan), ``auto``.

Models: PP-OCR cls/det/rec (from the rapidocr-onnxruntime wheel, where
installed) and the model-zoo CNN, MLP and transformer block. Every engine
gets the same seeded input and the same ``--threads``; rounds interleave the
engines (each round: best of three runs per engine) so the machine's drift
hits all alike. Reported per engine: best and median of the round bests (ms);
per model: ``auto / fastest`` of the engines auto chooses between (our
``cpu``, ``ncnn``; goal <= 1.05), ``auto / plain ORT`` and ``ncnn / plain ORT``. ``auto`` is a Runtime whose backend order races ``ncnn`` against
``cpu`` at load (``edge_runtime.engine_choice``). ``ncnn_vulkan`` runs where
ncnn sees a Vulkan device (on lavapipe it is a correctness path, not a fast one).

Prints JSON; ``--plot FILE.png`` draws the latencies.
Usage: ``python tools/bench_engines.py [--quick] [--threads 2] [--plot bench_engines.png]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tools"):
    if str(_path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(_path))


def _models(folder: Path, quick: bool) -> list[tuple[str, Path, tuple[int, ...]]]:
    import onnx

    from edge_runtime.model_zoo import build_mlp, build_mobilenet, build_transformer
    from ocr_models import ocr_models

    ocr = ocr_models()
    cases = [("ppocr_cls", ocr.get("cls"), (1, 3, 48, 192)),
             ("ppocr_det", ocr.get("det"), (1, 3, 160, 160) if quick else (1, 3, 320, 320)),
             ("ppocr_rec", ocr.get("rec"), (1, 3, 48, 320))]
    found = [(name, path, shape) for name, path, shape in cases if path is not None]
    for name, build, shape in (("zoo_mobilenet", build_mobilenet, (1, 3, 64, 64)), ("zoo_mlp", build_mlp, (1, 64)),
                               ("zoo_transformer", build_transformer, (1, 16, 64))):
        path = folder / f"{name}.onnx"
        onnx.save(build(), str(path))
        found.append((name, path, shape))
    return found


def _round_bests(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Per engine, the best ms of three back-to-back runs in each interleaved round."""
    for fn in fns.values():
        fn()  # warm-up: first-run allocations
    bests: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            best = float("inf")
            for _ in range(3):
                started = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - started)
            bests[name].append(best * 1e3)
    return bests


def bench_model(name: str, path: Path, shape: tuple[int, ...], threads: int, rounds: int, vulkan: bool,
                cache: Path) -> dict[str, Any]:
    import onnxruntime as ort

    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    config = RuntimeConfig(cache_dir=cache, intra_op_threads=threads)
    runtime = Runtime(config)
    racing = Runtime(RuntimeConfig(cache_dir=cache, intra_op_threads=threads, backend_order=("ncnn", "cpu")))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    feeds = {input_name: x}
    loaded: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    started = time.perf_counter()
    auto = racing.load(path, input_shapes={input_name: shape})
    auto_load_s = time.perf_counter() - started
    engines = [("cpu", "cpu"), ("ncnn_cpu", "ncnn")] + ([("ncnn_vulkan", "ncnn_vulkan")] if vulkan else [])
    for label, backend in engines:
        if not runtime.availability(backend).ok:
            skipped[label] = runtime.availability(backend).reason
            continue
        try:
            loaded[label] = runtime.load(path, backend=backend)
            loaded[label].run(feeds)  # conversion + gate happen here for dynamic models
        except Exception as exc:  # a benchmark reports an engine that cannot run, it does not stop
            skipped[label] = f"{type(exc).__name__}: {exc}"
            loaded.pop(label, None)
    fns: dict[str, Callable[[], object]] = {"plain_ort": lambda: session.run(None, feeds)}
    fns.update({label: (lambda m=m: m.run(feeds)) for label, m in loaded.items()})
    fns["auto"] = lambda: auto.run(feeds)
    bests = _round_bests(fns, rounds)
    best = {k: round(min(v), 4) for k, v in bests.items()}
    median = {k: round(statistics.median(v), 4) for k, v in bests.items()}
    # auto chooses between our cpu and ncnn; plain ORT is what a user would pick instead.
    choices = {k: v for k, v in median.items() if k in ("cpu", "ncnn_cpu")}
    fastest = min(choices, key=choices.get)
    row: dict[str, Any] = {
        "model": name, "input_shape": list(shape), "threads": threads, "rounds": rounds,
        "best_ms": best, "median_ms": median, "auto_backend": auto.backend, "auto_reason": auto.report.reason,
        "auto_tried": dict(auto.report.tried), "auto_load_s": round(auto_load_s, 2),
        "fastest_choice": fastest, "auto_vs_fastest": round(median["auto"] / choices[fastest], 3),
        "auto_vs_plain_ort": round(median["auto"] / median["plain_ort"], 3),
        "skipped": skipped}
    if "ncnn_cpu" in median:
        row["ncnn_vs_plain_ort"] = round(median["ncnn_cpu"] / median["plain_ort"], 3)
        row["our_cpu_vs_plain_ort"] = round(median["cpu"] / median["plain_ort"], 3)
    if "ncnn_vulkan" in median:
        row["vulkan_device"] = runtime.availability("ncnn_vulkan").device
    for model in (*loaded.values(), auto):
        model.close()
    runtime.close()
    racing.close()
    return row


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = ["plain_ort", "cpu", "ncnn_cpu", "ncnn_vulkan", "auto"]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.16
    for k, engine in enumerate(engines):
        values = [r["median_ms"].get(engine, np.nan) for r in rows]
        ax.bar(np.arange(len(rows)) + (k - 2) * width, values, width, label=engine)
    ax.set_xticks(np.arange(len(rows)), [r["model"] for r in rows], rotation=15)
    ax.set_yscale("log")
    ax.set_ylabel("median of round bests, ms (log)")
    ax.set_title(f"CPU engines, {rows[0]['threads']} threads, interleaved rounds")
    ax.legend(ncol=5, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads for every engine (default 2)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--quick", action="store_true", help="3 rounds, smaller det input, Vulkan on cls only")
    parser.add_argument("--no-vulkan", action="store_true", help="skip ncnn_vulkan even where present")
    parser.add_argument("--plot", type=Path, help="write a PNG chart here")
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as scratch:
        folder = Path(scratch)
        rows = []
        for name, path, shape in _models(folder, args.quick):
            vulkan = not args.no_vulkan and (not args.quick or name in ("ppocr_cls", "zoo_mobilenet"))
            rows.append(bench_model(name, path, shape, args.threads, rounds, vulkan, folder / "cache"))
            print(json.dumps(rows[-1]), file=sys.stderr)
    with_ncnn = [r for r in rows if "ncnn_vs_plain_ort" in r]
    summary = {"auto_within_1.05_of_fastest": all(r["auto_vs_fastest"] <= 1.05 for r in rows),
               "worst_auto_vs_fastest": max(r["auto_vs_fastest"] for r in rows),
               "ncnn_faster_than_plain_ort_on": [r["model"] for r in with_ncnn if r["ncnn_vs_plain_ort"] < 1],
               "auto_faster_than_plain_ort_on": [r["model"] for r in rows
                                                 if r["median_ms"]["auto"] < r["median_ms"]["plain_ort"]]}
    result = {"benchmark": "engines", "threads": args.threads, "rounds": rounds, "rows": rows, "summary": summary}
    if args.plot:
        plot(rows, args.plot)
        result["plot"] = str(args.plot)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
