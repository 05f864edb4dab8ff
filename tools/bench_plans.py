"""Benchmark: execution plans across backends against the best single backend.

For each model:

* latency (p50/p95 ms of ``--repeat`` runs after a warm-up) of every plan this
  device has (``cpu``, ``gpu``, ``hybrid``, ``auto``), against each backend
  alone on the whole model (plain ``onnxruntime.InferenceSession`` — the
  baseline a user would pick — and the accelerator when it takes every node);
  ratios are plan p50 / best single-backend p50 (below 1: the plan is faster);
* throughput of the hybrid pipeline (``run_many``: stage k of request n+1
  overlaps stage k+1 of request n) against the same plan run request by
  request, and against plain ONNX Runtime request by request;
* the cost model's estimate next to each measurement, and the worst relative
  difference of each plan's outputs from ONNX Runtime.

The warm-up (``first_run_s``: compile + first run, where OpenCL builds its
kernels) is reported apart. A time budget (``--budget-s``, default 150)
bounds the run: work not started by then is listed as skipped. (One step
started in time may still run over: PoCL builds the kernels of a PP-OCR
model for a minute or more, so ``--ocr`` takes longer on it.)

Usage: ``python tools/bench_plans.py --out bench_out/plans [--ocr]`` — JSON
on stdout and in ``OUT/bench_plans.json``, plot in ``OUT/bench_plans.png``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

# Zoo model -> input shapes (dynamic dims bound); PP-OCR name -> (kind in rapidocr's file names, shapes).
ZOO = {"mlp": {"input": (16, 64)}, "mobilenet": {"input": (1, 3, 64, 64)}, "transformer": {"tokens": (2, 16, 64)}}
OCR = {"ocr_det": ("det", {"x": (1, 3, 96, 160)}), "ocr_rec": ("rec", {"x": (1, 3, 48, 160)})}


def _max_rel_diff(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> float:
    return max(float(np.max(np.abs(got[k] - want[k]) / (np.abs(want[k]) + 1e-3))) for k in want)


def bench_model(runtime: Any, name: str, proto: Any, shapes: dict[str, tuple[int, ...]], *, repeat: int,
                requests: int, deadline: float) -> dict[str, Any]:
    """Every plan and every single backend on one model; see the module docstring."""
    import onnxruntime as ort

    from backends.errors import BackendUnavailableError, EdgeRuntimeError
    from edge_runtime.timing import measure_ms, summarise_ms

    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    out_names = [o.name for o in session.get_outputs()]
    expected = dict(zip(out_names, session.run(out_names, feeds)))
    single: dict[str, dict[str, Any]] = {"onnxruntime": summarise_ms(measure_ms(
        lambda: session.run(out_names, feeds), repeat))}
    accelerator = runtime.accelerator()
    if accelerator is not None and time.monotonic() > deadline:
        single[accelerator] = {"skipped": "time budget"}
    elif accelerator is not None:
        try:
            alone = runtime.backend(accelerator).compile(proto, runtime.compile_options())
            started = time.perf_counter()
            alone.run(feeds)
            first_s = time.perf_counter() - started
            single[accelerator] = {**summarise_ms(measure_ms(lambda: alone.run(feeds), repeat)),
                                   "first_run_s": round(first_s, 3)}
            alone.close()
        except (BackendUnavailableError, EdgeRuntimeError) as exc:
            single[accelerator] = {"skipped": f"cannot run the whole model: {exc}"[:200]}
    best_name, best = min(((k, v) for k, v in single.items() if "p50" in v), key=lambda kv: kv[1]["p50"])
    planner = runtime.planner(proto, shapes)
    plans: dict[str, dict[str, Any]] = {}
    executors = {}
    for plan in planner.available():
        if time.monotonic() > deadline:
            plans[plan] = {"skipped": "time budget"}
            continue
        layout = planner.layout(plan)
        started = time.perf_counter()
        executor = planner.compile(layout, runtime.compile_options())
        outputs = executor.run(feeds)
        first_s = time.perf_counter() - started
        stats = summarise_ms(measure_ms(lambda: executor.run(feeds), repeat, warmup=0))
        plans[plan] = {**stats, "ratio_vs_best_single": round(stats["p50"] / best["p50"], 3),
                       "est_ms": round(layout.partition.latency_s * 1e3, 4), "first_run_s": round(first_s, 3),
                       "stages": [f"{s.backend}:{len(s.spec.nodes)}" for s in executor.stages],
                       "max_rel_diff_vs_onnxruntime": _max_rel_diff(outputs, expected),
                       "fallbacks": sum(executor.fallbacks.values())}
        executors[plan] = executor
    result = {"model": name, "inputs": {k: list(v) for k, v in shapes.items()}, "single_backend": single,
              "best_single_backend": best_name, "plans": plans}
    pipelined = executors.get("hybrid") or executors.get("auto")
    if pipelined is not None and time.monotonic() < deadline:
        result["pipeline"] = _throughput(pipelined, session, out_names, feeds, requests)
    for executor in executors.values():
        executor.close()
    return result


def _throughput(executor: Any, session: Any, out_names: list[str], feeds: dict[str, np.ndarray],
                requests: int) -> dict[str, Any]:
    batch = [dict(feeds) for _ in range(requests)]
    executor.run_many(batch[:2])  # warm the worker path
    rates = {}
    for label, call in (("plan_sequential", lambda: [executor.run(f) for f in batch]),
                        ("plan_pipelined", lambda: executor.run_many(batch)),
                        ("onnxruntime_sequential", lambda: [session.run(out_names, f) for f in batch])):
        best_s = min(_seconds(call) for _ in range(2))
        rates[label] = round(requests / best_s, 2)
    return {"plan": executor.name, "stages": [s.backend for s in executor.stages], "requests": requests,
            "requests_per_s": rates,
            "pipelined_vs_sequential": round(rates["plan_pipelined"] / rates["plan_sequential"], 3),
            "pipelined_vs_onnxruntime": round(rates["plan_pipelined"] / rates["onnxruntime_sequential"], 3)}


def _seconds(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _models(names: list[str], with_ocr: bool) -> list[tuple[str, Any, dict[str, tuple[int, ...]]]]:
    import onnx

    from edge_runtime.model_zoo import BUILDERS

    models = [(name, BUILDERS[name](), ZOO[name]) for name in names]
    if with_ocr:
        spec = importlib.util.find_spec("rapidocr_onnxruntime")
        folder = Path(list(spec.submodule_search_locations)[0]) / "models" if spec else None
        for name, (kind, shapes) in OCR.items():
            path = next(folder.glob(f"*_{kind}_*.onnx"), None) if folder else None
            if path is not None:
                models.append((name, onnx.load(str(path)), shapes))
    return models


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in report["models"] if "plans" in m]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    labels = sorted({k for m in models for k, v in m["single_backend"].items() if "p50" in v}) + \
        [p for p in ("cpu", "gpu", "hybrid", "auto") if any("p50" in m["plans"].get(p, {}) for m in models)]
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        values = [(m["single_backend"].get(label) or m["plans"].get(label) or {}).get("p50", 0.0) for m in models]
        name = f"{label} (alone)" if any(label in m["single_backend"] for m in models) else f"plan {label}"
        left.bar(np.arange(len(models)) + i * width, values, width, label=name)
    left.set_xticks(np.arange(len(models)) + 0.4 - width / 2, [m["model"] for m in models])
    left.set_yscale("log")
    left.set_ylabel("p50 latency, ms (log)")
    left.set_title("latency: plans vs single backends")
    left.legend(fontsize=8)
    piped = [m for m in models if "pipeline" in m]
    kinds = ("onnxruntime_sequential", "plan_sequential", "plan_pipelined")
    for i, kind in enumerate(kinds):
        right.bar(np.arange(len(piped)) + i * 0.27, [m["pipeline"]["requests_per_s"][kind] for m in piped], 0.27,
                  label=kind.replace("_", " "))
    right.set_xticks(np.arange(len(piped)) + 0.27, [f"{m['model']}\n({m['pipeline']['plan']})" for m in piped])
    right.set_ylabel("requests / s")
    right.set_title("throughput: pipelined plan vs sequential")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench_out/plans"), help="output directory")
    parser.add_argument("--models", default=",".join(ZOO), help=f"zoo models, comma-separated ({', '.join(ZOO)})")
    parser.add_argument("--ocr", action="store_true", help="also PP-OCR det/rec (from rapidocr-onnxruntime)")
    parser.add_argument("--repeat", type=int, default=30, help="timed runs per plan (default 30)")
    parser.add_argument("--requests", type=int, default=24, help="requests per throughput run (default 24)")
    parser.add_argument("--budget-s", type=float, default=150.0, help="stop starting new work after this")
    args = parser.parse_args(argv)
    unknown = sorted(set(filter(None, args.models.split(","))) - set(ZOO))
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {sorted(ZOO)}")

    from edge_runtime.runtime import Runtime

    started = time.monotonic()
    deadline = started + args.budget_s
    runtime = Runtime()
    accelerator = runtime.accelerator()
    names = ["cpu", *([accelerator] if accelerator else [])]
    report: dict[str, Any] = {
        "accelerator": accelerator, "profile": runtime.match.name,
        "speeds": {n: runtime.backend_speed(n).to_dict() for n in names}, "models": []}
    for name, proto, shapes in _models([m for m in args.models.split(",") if m], args.ocr):
        if time.monotonic() > deadline:
            report["models"].append({"model": name, "skipped": "time budget"})
            continue
        report["models"].append(bench_model(runtime, name, proto, shapes, repeat=args.repeat,
                                            requests=args.requests, deadline=deadline))
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    runtime.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_plans.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "bench_plans.png")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
