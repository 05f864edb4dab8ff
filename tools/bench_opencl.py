"""Benchmark: the ``opencl`` backend against numpy and ONNX Runtime CPU on the same machine.

* GEMM (``MatMul`` with a weight matrix) at ``--sizes`` (256/512/1024): GFLOP/s of
  our kernel (device time from profiling events), of a whole ``run()`` (host
  copies included), of numpy's sgemm (``a @ b``) and of ONNX Runtime; the
  headline figure is ``kernel_vs_numpy``, our kernel as a fraction of numpy.
* Convolutions (1x1 pointwise, 3x3, depthwise 3x3): the same figures, with
  numpy doing the equivalent sgemm (same FLOPs) as the yardstick.
* Whole models from ``tools/make_models.py`` (MLP, MobileNet-style CNN,
  transformer block): latency of ``run()`` vs an ONNX Runtime session.
* Compile time of the MobileNet-style model with an empty cache directory vs a
  second backend reusing it (binaries and tuning), with the cache counters.
* fp16 accuracy (half storage, float arithmetic) against ORT.

Each measurement alternates ours and the baselines (so noise on a shared
machine hits all alike) and keeps the best of ``--repeat`` runs. Prints JSON;
``--plot FILE.png`` draws GFLOP/s and latency bars.

Usage: ``python tools/bench_opencl.py [--quick] [--plot bench_opencl.png]``
"""

from __future__ import annotations

import argparse
import json
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


def _best_s(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def _interleaved(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best seconds of each function, measured round-robin so machine noise hits all alike.

    Each round runs each function three times back to back and keeps the best.
    """
    for fn in fns.values():  # warm-up: first-run compiles and caches
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            best[name] = min(best[name], _best_s(fn, 3))
    return best


def _ort_session(model: Any) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    # NOTE: ORT's worker threads spin after a run by default; in a process that
    # alternates ORT with numpy and OpenCL they would steal the cores from the
    # next measurement.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _kernel_us(executable: Any, label_part: str) -> float:
    """Device time of the steps whose kernel name contains ``label_part`` (each best of 15)."""
    runner = next(iter(executable._cache.values()))  # noqa: SLF001 (benchmark introspection)
    rows = runner.profile(repeats=15)
    return sum(r["best_us"] for r in rows if label_part in r["kernel"])


def _rate_row(flops: float, kernel_us: float, times: dict[str, float], extra: dict[str, Any]) -> dict[str, Any]:
    gflops = {name: flops / t / 1e9 for name, t in times.items()}
    kernel = flops / (kernel_us * 1e3) if kernel_us else 0.0
    row = dict(extra)
    row.update({
        "mflop": round(flops / 1e6, 1),
        "opencl_kernel_gflops": round(kernel, 1),
        "opencl_run_gflops": round(gflops["opencl"], 1),
        "numpy_gflops": round(gflops["numpy"], 1),
        "onnxruntime_gflops": round(gflops["onnxruntime"], 1),
        "kernel_vs_numpy": round(kernel / gflops["numpy"], 3),
        "run_vs_numpy": round(gflops["opencl"] / gflops["numpy"], 3),
        "kernel_vs_onnxruntime": round(kernel / gflops["onnxruntime"], 3),
    })
    return row


def bench_gemm(backend: Any, n: int, repeat: int) -> dict[str, Any]:
    from onnx import TensorProto, helper, numpy_helper

    from backends.base import CompileOptions

    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], f"gemm{n}",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])], [numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    executable = backend.compile(model, CompileOptions())
    session = _ort_session(model)
    check = executable.run({"a": a})["y"]
    error = float(np.max(np.abs(check - a @ b)) / np.max(np.abs(a @ b)))
    times = _interleaved({"numpy": lambda: a @ b, "opencl": lambda: executable.run({"a": a}),
                          "onnxruntime": lambda: session.run(None, {"a": a})}, repeat)
    return _rate_row(2.0 * n ** 3, _kernel_us(executable, "gemm"), times, {"n": n, "max_rel_error": error})


def _conv_model(cin: int, cout: int, size: int, kernel: int, groups: int, seed: int) -> tuple[Any, np.ndarray]:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((cout, cin // groups, kernel, kernel)) * 0.1).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[kernel // 2] * 4, group=groups)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


def bench_conv(backend: Any, name: str, cin: int, cout: int, size: int, kernel: int, groups: int,
               repeat: int) -> dict[str, Any]:
    from backends.base import CompileOptions

    model, w = _conv_model(cin, cout, size, kernel, groups, seed=cin + kernel)
    x = np.random.default_rng(1).standard_normal((1, cin, size, size)).astype(np.float32)
    executable = backend.compile(model, CompileOptions())
    session = _ort_session(model)
    got = executable.run({"x": x})["y"]
    want = session.run(None, {"x": x})[0]
    error = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    flops = 2.0 * cout * (cin // groups) * kernel * kernel * size * size
    numpy_fn, numpy_flops = _numpy_conv_yardstick(w, x, groups)
    times = _interleaved({"numpy": numpy_fn, "opencl": lambda: executable.run({"x": x}),
                          "onnxruntime": lambda: session.run(None, {"x": x})}, repeat)
    times["numpy"] *= flops / numpy_flops  # numpy's rate, expressed on this conv's FLOPs
    # Every step counts (a padding copy before a 3x3 convolution included).
    return _rate_row(flops, _kernel_us(executable, ""), times,
                     {"conv": name, "cin": cin, "cout": cout, "size": size, "kernel": kernel,
                      "groups": groups, "max_rel_error": error})


def _numpy_conv_yardstick(w: np.ndarray, x: np.ndarray, groups: int) -> tuple[Callable[[], object], float]:
    """What numpy does best for this conv, and its FLOPs.

    Dense: the sgemm an im2col + BLAS convolution runs (same shape, same FLOPs).
    Depthwise: a sum of shifted slices times per-channel weights (no GEMM fits).
    """
    cout, cin_g, kernel, _ = w.shape
    size = x.shape[-1]
    if groups == 1:
        a = np.ascontiguousarray(w.reshape(cout, -1))
        cols = np.random.default_rng(2).standard_normal((cin_g * kernel * kernel, size * size)).astype(np.float32)
        return (lambda: a @ cols), 2.0 * a.shape[0] * a.shape[1] * cols.shape[1]
    pad = kernel // 2
    xp = np.pad(x[0], ((0, 0), (pad, pad), (pad, pad)))
    taps = [(w[:, 0, i, j, None, None], i, j) for i in range(kernel) for j in range(kernel)]

    def depthwise() -> np.ndarray:
        out = np.zeros((cout, size, size), np.float32)
        for weight, i, j in taps:
            out += weight * xp[:, i:i + size, j:j + size]
        return out

    return depthwise, 2.0 * cout * kernel * kernel * size * size


def bench_models(backend: Any, repeat: int, image_size: int) -> list[dict[str, Any]]:
    from make_models import build_mlp, build_mobilenet, build_transformer

    from backends.base import CompileOptions

    rng = np.random.default_rng(3)
    cases = [("mlp", build_mlp(), {"input": (1, 64)}),
             ("mobilenet", build_mobilenet(image_size=image_size), {"input": (1, 3, image_size, image_size)}),
             ("transformer", build_transformer(), {"tokens": (1, 16, 64)})]
    rows = []
    for name, model, shapes in cases:
        feeds = {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
        executable = backend.compile(model, CompileOptions())
        session = _ort_session(model)
        got = list(executable.run(feeds).values())[0]
        want = session.run(None, feeds)[0]
        times = _interleaved({"opencl": lambda: executable.run(feeds),
                              "onnxruntime": lambda: session.run(None, feeds)}, repeat * 4)
        spec = executable.describe()["specialisations"][0]
        rows.append({"model": name, "opencl_ms": round(times["opencl"] * 1e3, 3),
                     "onnxruntime_ms": round(times["onnxruntime"] * 1e3, 3),
                     "opencl_vs_onnxruntime": round(times["onnxruntime"] / times["opencl"], 3),
                     "kernels": spec["kernels"], "nodes": len(model.graph.node),
                     "buffer_bytes": spec["buffer_bytes"],
                     "max_rel_error": float(np.max(np.abs(got - want)) / np.max(np.abs(want)))})
    return rows


def bench_compile(image_size: int) -> dict[str, Any]:
    """MobileNet-style compile + first run: empty cache dir, then a new backend reusing it."""
    from make_models import build_mobilenet

    from backends.base import CompileOptions
    from backends.opencl import OpenCLBackend

    model = build_mobilenet(image_size=image_size)
    feeds = {"input": np.zeros((1, 3, image_size, image_size), np.float32)}
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label in ("first", "cached"):
            backend = OpenCLBackend(cache_dir=Path(tmp), tune=True, tune_min_flops=4e6)
            backend.availability()  # the canary is not compile time
            started = time.perf_counter()
            executable = backend.compile(model, CompileOptions())
            executable.run(feeds)
            elapsed = time.perf_counter() - started
            spec = executable.describe()["specialisations"][0]
            out[label] = {"compile_and_first_run_s": round(elapsed, 3), "phases_s": spec["times_s"],
                          "counters": backend.stats.snapshot()}
    out["note"] = ("'cached' reuses program binaries and tuning choices from the cache dir; PoCL's "
                   "own kernel cache (see pocl_kernel_cache) also serves its per-kernel JIT")
    return out


def bench_fp16(backend: Any) -> dict[str, Any]:
    from make_models import build_mobilenet

    from backends.base import CompileOptions
    from backends.errors import BackendUnavailableError

    model = build_mobilenet(image_size=32)
    feeds = {"input": np.random.default_rng(4).standard_normal((2, 3, 32, 32)).astype(np.float32)}
    want = _ort_session(model).run(None, feeds)[0]
    try:
        got = backend.compile(model, CompileOptions(precision="fp16")).run(feeds)["probabilities"]
        how = "precision='fp16' (device has cl_khr_fp16)"
    except BackendUnavailableError as exc:
        got = half_storage_outputs(model, feeds)
        how = f"half-storage kernels run directly ({exc})"
    return {"model": "mobilenet", "max_rel_error": float(np.max(np.abs(got - want)) / np.max(np.abs(want))),
            "how": how}


def half_storage_outputs(model: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """First output of ``model`` run with half-storage kernels, bypassing the cl_khr_fp16 check.

    vload_half/vstore_half are core OpenCL, so the fp16 kernels run on any
    device; this measures their accuracy where compile() refuses fp16.
    """
    from backends.opencl.builder import ProgramBuilder
    from backends.opencl.compiler import specialise
    from backends.opencl.device import shared_device
    from backends.opencl.fusion import plan_groups
    from backends.opencl.graph import analyse
    from backends.opencl.runner import PreparedProgram
    from backends.opencl.stats import CompileStats
    from backends.opencl.tuning import Tuner

    analysis = analyse(model)
    program = specialise(analysis, plan_groups(analysis), {k: v.shape for k, v in feeds.items()}, {})
    stats = CompileStats()
    builder = ProgramBuilder(shared_device(), None, "", stats)
    tuner = Tuner(builder, None, enabled=False, min_flops=0, stats=stats, options="-w -DUSE_HALF")
    return next(iter(PreparedProgram(program, builder, tuner, half=True, label="fp16", plan_s=0.0)
                     .run(feeds).values()))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    series = [("numpy_gflops", "numpy sgemm"), ("onnxruntime_gflops", "ONNX Runtime"),
              ("opencl_kernel_gflops", "OpenCL kernel"), ("opencl_run_gflops", "OpenCL run()")]
    for ax, rows, key, title in ((axes[0], result["gemm"], "n", "GEMM n x n x n"),
                                 (axes[1], result["conv"], "conv", "Convolutions")):
        labels = [str(r[key]) for r in rows]
        width = 0.2
        for i, (field, name) in enumerate(series):
            ax.bar([x + i * width for x in range(len(rows))], [r[field] for r in rows], width, label=name)
        ax.set_xticks([x + 1.5 * width for x in range(len(rows))], labels)
        ax.set_ylabel("GFLOP/s")
        ax.set_title(title)
        ax.legend(fontsize=8)
    models = result["models"]
    ax = axes[2]
    xs = range(len(models))
    ax.bar([x - 0.2 for x in xs], [m["onnxruntime_ms"] for m in models], 0.4, label="ONNX Runtime")
    ax.bar([x + 0.2 for x in xs], [m["opencl_ms"] for m in models], 0.4, label="OpenCL")
    ax.set_xticks(list(xs), [m["model"] for m in models])
    ax.set_ylabel("latency, ms (lower is better)")
    ax.set_title("Whole models, batch 1")
    ax.legend(fontsize=8)
    fig.suptitle(f"edge-runtime OpenCL backend on {result['device']['name']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024], help="GEMM sizes n")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per measurement (best kept)")
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (a smoke run)")
    parser.add_argument("--plot", type=Path, help="write a PNG chart here")
    parser.add_argument("--cold-pocl-cache", action="store_true",
                        help="point PoCL's own kernel cache at an empty temp dir, so first-compile "
                             "times include PoCL's per-kernel JIT (set before the driver loads)")
    args = parser.parse_args(argv)
    pocl_cache = "default (~/.cache/pocl; may already hold these kernels)"
    if args.cold_pocl_cache:
        import os

        os.environ["POCL_CACHE_DIR"] = tempfile.mkdtemp(prefix="pocl-cold-")
        pocl_cache = "fresh temp dir"
    from backends.opencl import OpenCLBackend
    from backends.opencl.device import describe_info, shared_device

    sizes = [128, 256] if args.quick else args.sizes
    repeat = 2 if args.quick else args.repeat
    image = 32 if args.quick else 96
    backend = OpenCLBackend(tune=True)
    availability = backend.availability()
    if not availability.ok:
        print(json.dumps({"error": availability.reason}))
        return 1
    started = time.perf_counter()
    convs = [("pointwise 1x1", 128, 128, 28, 1, 1), ("3x3", 64, 64, 28, 3, 1), ("depthwise 3x3", 128, 128, 56, 3, 128)]
    if not args.quick:
        convs[0] = ("pointwise 1x1", 256, 256, 28, 1, 1)
        convs[1] = ("3x3", 64, 64, 56, 3, 1)
    import onnxruntime

    result: dict[str, Any] = {
        "device": describe_info(shared_device().info), "numpy": np.__version__,
        "onnxruntime": onnxruntime.__version__, "pocl_kernel_cache": pocl_cache,
        "gemm": [bench_gemm(backend, n, repeat) for n in sizes],
        "conv": [bench_conv(backend, *c, repeat=repeat) for c in convs],
        "models": bench_models(backend, repeat, image),
        "compile": bench_compile(image),
        "fp16_accuracy": bench_fp16(backend),
    }
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    if args.plot:
        plot(result, args.plot)
        result["plot"] = str(args.plot)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
