"""Benchmark: ``auto`` on the default configuration against every fixed plan, interleaved.

For each model, on a runtime with no backend pinned (and, unless ``--cache``
is given, a fresh cache, so calibration and the plan race run as on a first
start):

* ``auto``: ``Runtime.load(path, input_shapes=...)`` as a user or the daemon
  loads it: the measured race (``plan_race``), in a child process while this
  process has no GPU driver mapped; its load time, winner and every
  candidate's estimate and measurement are reported, and whether PoCL was
  mapped once every ``auto`` model had loaded (before any fixed plan);
* every fixed plan this device has (``cpu``, ``gpu``, ``hybrid``), compiled
  apart, and plain ``onnxruntime.InferenceSession`` (same threads); no side's
  ORT pool spins (as served), or it would slow the side run after it;
* all of them timed in interleaved rounds (best of 3 per round, p50 = median
  over rounds), so the machine's drift hits every side alike; ratios are
  ``auto`` p50 / each fixed plan's p50, and / the best fixed plan's;
* throughput of the hybrid pipeline (``run_many``) against the same plan
  request by request and plain ONNX Runtime, where a hybrid plan exists.

Held-out exported models (``--ocr``): the PP-OCR detector, direction
classifier and recogniser shipped with rapidocr-onnxruntime. A time budget
(``--budget-s``) bounds the run: models not started by then are listed as
skipped (PoCL builds a PP-OCR model's kernels for a minute or more).

Usage: ``python tools/bench_plans.py --out bench_out/plans [--ocr]`` — JSON
on stdout and in ``OUT/bench_plans.json``, plot in ``OUT/bench_plans.png``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

# Zoo model -> input shapes (dynamic dims bound); PP-OCR name -> (kind in rapidocr's file names, shapes).
ZOO = {"mlp": {"input": (16, 64)}, "mobilenet": {"input": (1, 3, 64, 64)}, "transformer": {"tokens": (2, 16, 64)},
       "resnet": {"input": (1, 3, 112, 112)}}
OCR = {"ocr_det": ("det", {"x": (1, 3, 96, 160)}), "ocr_cls": ("cls", {"x": (1, 3, 48, 192)}),
       "ocr_rec": ("rec", {"x": (1, 3, 48, 320)})}
FIXED = ("cpu", "gpu", "hybrid")
ROUNDS = 15


def _max_rel_diff(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> float:
    return max(float(np.max(np.abs(got[k] - want[k]) / (np.abs(want[k]) + 1e-3))) for k in want)


def interleaved_p50(runners: dict[str, Callable[[], object]], rounds: int = ROUNDS) -> dict[str, dict[str, float]]:
    """Per side: p50 (median over rounds of the best of 3) and p95 over every run, in ms; the order
    rotates each round."""
    bests: dict[str, list[float]] = {name: [] for name in runners}
    every: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    for round_index in range(rounds):
        shift = round_index % len(names)  # each side follows every other side in turn
        for name in names[shift:] + names[:shift]:
            call = runners[name]
            runs = []
            for _ in range(3):
                start = time.perf_counter()
                call()
                runs.append((time.perf_counter() - start) * 1e3)
            bests[name].append(min(runs))
            every[name].extend(runs)
    return {name: {"p50": round(statistics.median(bests[name]), 4),
                   "p95": round(float(np.percentile(every[name], 95)), 4)} for name in runners}


def _options(runtime: Any) -> Any:
    """The runtime's compile options without spinning (as served): an ORT pool spinning after its
    run would take the cores from whichever side runs next in the interleaved rounds."""
    import dataclasses

    return dataclasses.replace(runtime.compile_options(), allow_spinning=False)


def load_auto(runtime: Any, path: Path, shapes: dict[str, tuple[int, ...]]) -> tuple[Any, dict[str, Any]]:
    """``auto`` as the daemon loads it, with its load time and race."""
    started = time.perf_counter()
    model = runtime.load(path, input_shapes=shapes, options=_options(runtime))
    load_s = time.perf_counter() - started
    decision = model.report.decision
    return model, {"backend": model.backend, "load_s": round(load_s, 3),
                   "race": decision.to_dict() if decision is not None else None}


def bench_model(runtime: Any, name: str, path: Path, proto: Any, shapes: dict[str, tuple[int, ...]], auto: Any,
                auto_info: dict[str, Any], *, requests: int) -> dict[str, Any]:
    """``auto`` against every fixed plan and plain ONNX Runtime on one model; see the module docstring."""
    import onnxruntime as ort

    from backends.errors import EdgeRuntimeError

    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
    session_options = ort.SessionOptions()
    session_options.intra_op_num_threads = runtime.threads
    session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(proto.SerializeToString(), session_options, providers=["CPUExecutionProvider"])
    out_names = [o.name for o in session.get_outputs()]
    expected = dict(zip(out_names, session.run(out_names, feeds)))
    fixed: dict[str, Any] = {}
    plans: dict[str, dict[str, Any]] = {}
    for plan in FIXED:
        started = time.perf_counter()
        try:
            fixed[plan] = runtime.load(path, plan=plan, input_shapes=shapes, options=_options(runtime))
        except EdgeRuntimeError as exc:
            plans[plan] = {"skipped": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        outputs = fixed[plan].run(feeds)
        executor = fixed[plan].executable
        plans[plan] = {"first_run_s": round(time.perf_counter() - started, 3),
                       "est_ms": getattr(executor, "estimated_ms", None),
                       "stages": [f"{s.backend}:{len(s.spec.nodes)}" for s in getattr(executor, "stages", [])],
                       "max_rel_diff_vs_onnxruntime": _max_rel_diff(outputs, expected)}
    auto_diff = _max_rel_diff(auto.run(feeds), expected)
    runners: dict[str, Callable[[], object]] = {"auto": lambda: auto.run(feeds),
                                                "onnxruntime": lambda: session.run(out_names, feeds)}
    runners.update({plan: (lambda m=m: m.run(feeds)) for plan, m in fixed.items()})
    timed = interleaved_p50(runners)
    for plan in fixed:
        plans[plan].update(timed[plan])
    best_plan = min(fixed, key=lambda p: timed[p]["p50"])
    result = {"model": name, "inputs": {k: list(v) for k, v in shapes.items()},
              "auto": {**auto_info, **timed["auto"], "max_rel_diff_vs_onnxruntime": auto_diff},
              "onnxruntime": timed["onnxruntime"], "plans": plans, "best_fixed_plan": best_plan,
              "auto_vs_plan_p50": {p: round(timed["auto"]["p50"] / timed[p]["p50"], 3) for p in fixed},
              "auto_vs_best_fixed_p50": round(timed["auto"]["p50"] / timed[best_plan]["p50"], 3)}
    hybrid = fixed.get("hybrid")
    if hybrid is not None and len(set(getattr(hybrid.executable, "backends", ()))) > 1:
        result["pipeline"] = _throughput(hybrid.executable, session, out_names, feeds, requests)
    for model in fixed.values():
        model.close()
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


def _models(names: list[str], with_ocr: bool, folder: Path) -> list[tuple[str, Path, Any, dict[str, tuple[int, ...]]]]:
    """(name, file, proto, shapes) of each model: zoo models written to ``folder``, PP-OCR files as shipped."""
    import onnx

    from edge_runtime import model_zoo

    models = []
    for name in names:
        proto = getattr(model_zoo, f"build_{name}")()
        path = folder / f"{name}.onnx"
        onnx.save(proto, str(path))
        models.append((name, path, proto, ZOO[name]))
    if with_ocr:
        spec = importlib.util.find_spec("rapidocr_onnxruntime")
        shipped = Path(list(spec.submodule_search_locations)[0]) / "models" if spec else None
        for name, (kind, shapes) in OCR.items():
            path = next(shipped.glob(f"*_{kind}_*.onnx"), None) if shipped else None
            if path is not None:
                models.append((name, path, onnx.load(str(path)), shapes))
    return models


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in report["models"] if "auto" in m]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    labels = ["auto", *FIXED, "onnxruntime"]
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        values = [(m["auto"] if label == "auto" else m["onnxruntime"] if label == "onnxruntime"
                   else m["plans"].get(label, {})).get("p50", 0.0) for m in models]
        left.bar(np.arange(len(models)) + i * width, values, width, label=label if label in ("auto", "onnxruntime")
                 else f"plan {label}")
    left.set_xticks(np.arange(len(models)) + 0.4 - width / 2, [m["model"] for m in models], fontsize=8)
    left.set_yscale("log")
    left.set_ylabel("p50 latency, ms (log; interleaved, median of best-of-3 rounds)")
    left.set_title("auto (default configuration) vs fixed plans")
    left.legend(fontsize=8)
    ratios = [m["auto_vs_best_fixed_p50"] for m in models]
    right.bar(np.arange(len(models)), ratios, 0.6,
              color=["tab:green" if r <= 1.1 else "tab:orange" if r <= 1.2 else "tab:red" for r in ratios])
    right.axhline(1.1, ls="--", c="k", lw=0.8, label="1.1x (zoo goal)")
    right.axhline(1.2, ls=":", c="k", lw=0.8, label="1.2x (held-out goal)")
    right.set_xticks(np.arange(len(models)), [f"{m['model']}\n({m['auto']['backend']})" for m in models], fontsize=8)
    right.set_ylabel("auto p50 / best fixed plan p50")
    right.set_title("auto vs the best fixed plan")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench_out/plans"), help="output directory")
    parser.add_argument("--models", default=",".join(ZOO), help=f"zoo models, comma-separated ({', '.join(ZOO)})")
    parser.add_argument("--ocr", action="store_true", help="also PP-OCR det/cls/rec (from rapidocr-onnxruntime)")
    parser.add_argument("--cache", type=Path, default=None, help="cache directory (default: a fresh one)")
    parser.add_argument("--requests", type=int, default=24, help="requests per throughput run (default 24)")
    parser.add_argument("--budget-s", type=float, default=600.0, help="stop starting new work after this")
    args = parser.parse_args(argv)
    unknown = sorted(set(filter(None, args.models.split(","))) - set(ZOO))
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {sorted(ZOO)}")

    from edge_runtime.config import RuntimeConfig, runtime_config
    from edge_runtime.plan_choice import gpu_driver_loaded
    from edge_runtime.runtime import Runtime

    started = time.monotonic()
    deadline = started + args.budget_s
    work = Path(tempfile.mkdtemp(prefix="bench_plans_"))
    config = runtime_config()
    config = RuntimeConfig(**{**config.__dict__, "cache_dir": args.cache or work / "cache"})
    runtime = Runtime(config)
    models = _models([m for m in args.models.split(",") if m], args.ocr, work)
    report: dict[str, Any] = {"profile": runtime.match.name, "backend_order": runtime.backend_order(),
                              "cache": str(config.cache_dir), "models": []}
    # Every auto first, as a daemon starting with these models would load them.
    autos = {}
    for name, path, proto, shapes in models:
        if time.monotonic() > deadline:
            continue
        autos[name] = load_auto(runtime, path, shapes)
    report["gpu_driver_mapped_after_auto_loads"] = gpu_driver_loaded()
    for name, path, proto, shapes in models:
        if name not in autos or time.monotonic() > deadline:
            report["models"].append({"model": name, "skipped": "time budget"})
            continue
        auto, info = autos[name]
        report["models"].append(bench_model(runtime, name, path, proto, shapes, auto, info, requests=args.requests))
        auto.close()
    report["speeds"] = {n: runtime.backend_speed(n).to_dict() for n in ("cpu", runtime.accelerator()) if n}
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    runtime.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_plans.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "bench_plans.png")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
