"""Benchmark: the ``vulkan`` backend against ``cpu`` and ``opencl`` (ONNX) / ``tflite`` (.tflite), same run.

Per model and backend, each measurement is a fresh child process (the Mesa
shader cache is chosen before any driver loads):

* ``cold_first_s``: load + first run with an empty shader cache;
* ``warm_first_s``: load + first run again, the cache now filled;
* ``p50_ms``: steady median of ``--runs`` runs after the first.

Backends alternate within each round (machine noise hits all alike); the
best of ``--rounds`` is kept. Ratios are vulkan / cpu. On lavapipe (a CPU
Vulkan driver) the vulkan figures measure correctness and placement, not GPU
speed: lavapipe runs the shaders on the same cores the CPU backend uses.

Usage: ``python tools/bench_vulkan.py --mediapipe WHEEL_OR_DIR --quick --plot bench_vulkan.png``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

TFLITE_MODELS = ("hand_recrop.tflite",)
OCR_SHAPES = {"x": [1, 3, 48, 192]}  # the classifier's dynamic input at the size PaddleOCR feeds it


def _child(backend: str, model: str, runs: int, shapes: dict[str, list[int]]) -> dict[str, float]:
    from edge_runtime.config import runtime_config
    from edge_runtime.feeds import random_feeds
    from edge_runtime.runtime import Runtime

    runtime = Runtime(runtime_config())
    started = time.perf_counter()
    loaded = runtime.load(model, backend=backend)
    specs = [type(s)(s.name, s.dtype, tuple(shapes.get(s.name, s.shape))) for s in loaded.inputs]
    feeds = random_feeds(specs, seed=0)
    loaded.run(feeds)
    first_s = time.perf_counter() - started
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        loaded.run(feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    loaded.close()
    return {"first_s": first_s, "p50_ms": float(np.median(times))}


def _measure(backend: str, model: Path, runs: int, cache: Path, shapes: dict) -> dict[str, float] | None:
    env = {**os.environ, "MESA_SHADER_CACHE_DIR": str(cache / "mesa"), "EDGE_RUNTIME_CACHE": str(cache / "rt"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, __file__, "--child", backend, str(model), "--runs", str(runs),
                           "--shapes", json.dumps(shapes)],
                          capture_output=True, text=True, env=env, timeout=900, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        errors = [line for line in lines if "Error" in line] or lines[-1:]  # LiteRT logs INFO lines last
        sys.stderr.write(f"{backend} on {model.name} failed (exit {done.returncode}): {errors[-1:]}\n")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _models(mediapipe: Path | None, workdir: Path) -> dict[str, tuple[Path, tuple[str, ...], dict]]:
    import importlib.util

    found: dict[str, tuple[Path, tuple[str, ...], dict]] = {}
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec and spec.submodule_search_locations:
        for path in (Path(list(spec.submodule_search_locations)[0]) / "models").glob("*_cls_*.onnx"):
            found["ppocr_cls"] = (path, ("vulkan", "cpu", "opencl"), OCR_SHAPES)
    if mediapipe is not None:
        sys.path.insert(0, str(ROOT / "tests" / "backends" / "tflite"))
        from test_tflite_mediapipe import _from_wheels

        for name, path in _from_wheels(mediapipe, workdir).items():
            if name in TFLITE_MODELS:
                found[name.removesuffix(".tflite")] = (path, ("vulkan", "tflite"), {})
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mediapipe", type=Path, help="mediapipe 0.10.x wheel or folder (for .tflite models)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="1 round of 10 runs")
    parser.add_argument("--only", action="append", default=[], help="measure only this model (repeatable)")
    parser.add_argument("--plot", type=Path, default=Path("bench_vulkan.png"))
    parser.add_argument("--child", nargs=2, metavar=("BACKEND", "MODEL"), help=argparse.SUPPRESS)
    parser.add_argument("--shapes", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child[0], args.child[1], args.runs, json.loads(args.shapes))))
        return 0
    rounds, runs = (1, 10) if args.quick else (args.rounds, args.runs)
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model, (path, backends, shapes) in _models(args.mediapipe, Path(tmp)).items():
            if args.only and model not in args.only:
                continue
            best: dict[str, dict[str, float]] = {}
            for r in range(rounds):
                for backend in backends:
                    cache = Path(tmp) / f"{model}-{backend}-{r}"
                    cold = _measure(backend, path, runs, cache, shapes)
                    warm = _measure(backend, path, runs, cache, shapes)
                    if cold is None or warm is None:
                        continue
                    row = {"cold_first_s": cold["first_s"], "warm_first_s": warm["first_s"],
                           "p50_ms": min(cold["p50_ms"], warm["p50_ms"])}
                    old = best.get(backend)
                    best[backend] = row if old is None else {k: min(old[k], row[k]) for k in row}
            reference = best.get("cpu") or best.get("tflite")
            if reference and "vulkan" in best:
                best["vulkan_over_cpu"] = {k: best["vulkan"][k] / reference[k] for k in reference}
            results[model] = best
    report = {"rounds": rounds, "runs": runs, "note": "lavapipe measures correctness; speed needs a real GPU",
              "models": results}
    print(json.dumps(report, indent=2))
    _plot(results, args.plot)
    return 0


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = ("cold_first_s", "warm_first_s", "p50_ms")
    fig, axes = plt.subplots(1, len(metrics), figsize=(12, 4))
    for ax, metric in zip(axes, metrics):
        labels, values = [], []
        for model, rows in results.items():
            for backend, row in rows.items():
                if backend != "vulkan_over_cpu":
                    labels.append(f"{model}\n{backend}")
                    values.append(row[metric])
        ax.bar(range(len(values)), values)
        ax.set_xticks(range(len(values)), labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_title(metric)
    fig.suptitle("vulkan vs cpu/opencl/tflite (lavapipe: correctness, not GPU speed)")
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    sys.exit(main())
