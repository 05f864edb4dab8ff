"""Backend speed calibration: a short micro-benchmark through the backend contract.

Six tiny ONNX models are compiled on the backend and timed (best of a few
runs, within a time budget, ~2 s at most):

* ``add(1, 1)`` / ``add(1, K)``: one vs K chained scalar Adds on one element
  give the fixed cost of a run and the per-node launch cost;
* ``fan(1, 4)``: four one-element inputs and outputs give the per-tensor copy
  latency (device backends);
* ``add(N, 1)`` / ``add(N, K)`` on N floats give memory bandwidth and, on a
  device backend, host<->device copy bandwidth;
* ``matmul(S)`` and a 3x3 ``conv`` give compute speeds (GFLOP/s): matrix
  products and convolutions run at rather different speeds on some backends.

Results are cached in ``cache_dir/calibration.json`` keyed on backend name,
device key and the benchmark's format version, so it runs once per device.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from backends.base import Backend, CompileOptions
from backends.errors import UnsupportedNodesError
from edge_runtime.planning.cost import BackendSpeed

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

CACHE_FILE = "calibration.json"
_FORMAT = 2  # bump when the micro-models change, so stale entries are measured again
_BIG_ELEMS = 1 << 20
_CHAIN = 8
_FAN = 4
_MATMUL = 256
_CONV = (32, 32)  # 3x3 convolution, 32 -> 32 channels on a 32x32 image: 19 MFLOP

SpeedMeasure = Callable[[Backend, CompileOptions, bool], BackendSpeed]


def default_speed(name: str, on_host: bool) -> BackendSpeed:
    """Assumed speed when measuring is impossible: a modest phone CPU, or a device behind copies."""
    if on_host:
        return BackendSpeed(name, gflops=20.0, mem_gbps=8.0, launch_us=5.0, stage_us=20.0)
    return BackendSpeed(name, gflops=20.0, mem_gbps=8.0, launch_us=20.0, stage_us=50.0,
                        copy_gbps=4.0, copy_latency_us=20.0)


def measure_speed(backend: Backend, options: CompileOptions, on_host: bool, budget_s: float = 2.0) -> BackendSpeed:
    """Time the micro-models on ``backend``; raises EdgeRuntimeError if it cannot run them.

    Past ``budget_s`` each model runs only twice, and the optional ones (the
    copy-latency fan, the conv) are skipped; kernel builds still take what they take.
    """
    options = dataclasses.replace(options, cache_dir=None)  # micro-models must not fill the model cache
    deadline = time.perf_counter() + budget_s

    def best(model: "onnx.ModelProto") -> float:
        return _best_time(backend, options, model, deadline)

    small_1, small_k = best(_add_chain(1, 1)), best(_add_chain(1, _CHAIN))
    big_1, big_k = best(_add_chain(_BIG_ELEMS, 1)), best(_add_chain(_BIG_ELEMS, _CHAIN))
    launch_s = max(0.0, (small_k - small_1) / (_CHAIN - 1))
    add_mem_s = max(1e-7, (big_k - big_1) / (_CHAIN - 1) - launch_s)
    fixed_s = max(0.0, small_1 - launch_s)
    copy_gbps, copy_latency_s = None, 0.0
    if not on_host:
        if time.perf_counter() < deadline:
            fan = best(_fan(_FAN))
            copy_latency_s = max(0.0, (fan - small_1 - (_FAN - 1) * launch_s) / (2 * (_FAN - 1)))
            fixed_s = max(0.0, fixed_s - 2 * copy_latency_s)
        big_copy_s = max(1e-7, (big_1 - small_1 - add_mem_s) / 2)  # one way, N floats
        copy_gbps = _clamp(4.0 * _BIG_ELEMS / big_copy_s / 1e9, 0.05, 1e4)

    def gflops(model: "onnx.ModelProto", flops: float, io_bytes: float) -> float:
        """FLOP/s of one compute-bound micro-model, its fixed cost and copies taken out."""
        moved_s = 0.0 if copy_gbps is None else io_bytes / (copy_gbps * 1e9)
        return _clamp(flops / max(1e-7, best(model) - small_1 - moved_s) / 1e9, 0.05, 1e5)

    side, ch = _CONV
    conv_gflops = None
    matmul_gflops = gflops(_matmul(_MATMUL), 2.0 * _MATMUL**3, 8.0 * _MATMUL**2)
    if time.perf_counter() < deadline:
        conv_gflops = gflops(_conv(side, ch), 2.0 * side * side * ch * ch * 9, 8.0 * side * side * ch)
    mem_gbps = _clamp(8.0 * _BIG_ELEMS / add_mem_s / 1e9, 0.05, 1e4)  # one Add reads and writes N floats
    return BackendSpeed(backend.name, gflops=matmul_gflops, mem_gbps=mem_gbps, launch_us=launch_s * 1e6,
                        stage_us=fixed_s * 1e6, copy_gbps=copy_gbps, copy_latency_us=copy_latency_s * 1e6,
                        conv_gflops=conv_gflops)


def cached_speed(backend: Backend, device_key: str, cache_dir: Path | None, options: CompileOptions,
                 on_host: bool, measure: SpeedMeasure = measure_speed) -> BackendSpeed:
    """The backend's speed from ``cache_dir/calibration.json``, measured and stored on first use.

    A backend that cannot run the micro-models gets ``default_speed`` (not cached, logged).
    """
    key = f"{backend.name}|{device_key}|v{_FORMAT}"
    path = None if cache_dir is None else Path(cache_dir) / CACHE_FILE
    entries = read_entries(path)
    if key in entries:
        try:
            return BackendSpeed.from_dict(entries[key])
        except (TypeError, ValueError) as exc:
            log.warning("calibration entry %s in %s is unusable (%s); measuring again", key, path, exc)
    started = time.perf_counter()
    try:
        speed = measure(backend, options, on_host)
    except Exception as exc:  # a backend that breaks on micro-models still gets a (default) speed
        log.warning("cannot calibrate backend %s (%s); assuming default speeds", backend.name, exc)
        return default_speed(backend.name, on_host)
    log.info("calibrated %s in %.2f s: %s", backend.name, time.perf_counter() - started, speed)
    if path is not None:
        write_entry(path, key, {**speed.to_dict(), "measured_at": time.time()})
    return speed


def read_entries(path: Path | None) -> dict[str, dict]:
    """The JSON object cached in ``path`` (empty when missing or unreadable)."""
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("cache file %s unreadable (%s); ignoring it", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def write_entry(path: Path, key: str, entry: dict) -> None:
    """Merge one entry into the cache file atomically (other processes may write too)."""
    entries = read_entries(path)
    entries[key] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


def _best_time(backend: Backend, options: CompileOptions, model: "onnx.ModelProto", deadline: float,
               repeat: int = 5) -> float:
    """Least wall seconds of a few runs (the least is the least disturbed by a noisy machine)."""
    from backends.onnx_graph import graph_inputs, node_label, tensor_specs

    specs = tensor_specs(model)
    refused = [node_label(n, i) for i, n in enumerate(model.graph.node) if not backend.supports(n, specs)]
    if refused:
        raise UnsupportedNodesError(backend.name, refused)
    executable = backend.compile(model, options)
    try:
        rng = np.random.default_rng(0)
        feeds = {spec.name: rng.standard_normal([int(d) for d in spec.shape]).astype(np.float32)
                 for spec in graph_inputs(model)}
        executable.run(feeds)  # warm-up: first-run allocation and kernel builds
        best = float("inf")
        for i in range(repeat):
            if i >= 2 and time.perf_counter() > deadline:
                break
            start = time.perf_counter()
            executable.run(feeds)
            best = min(best, time.perf_counter() - start)
        return best
    finally:
        executable.close()


def _add_chain(elements: int, depth: int) -> "onnx.ModelProto":
    from onnx import TensorProto, helper

    nodes, inits, previous = [], [], "x"
    for i in range(depth):
        inits.append(helper.make_tensor(f"c{i}", TensorProto.FLOAT, [1], [0.5 + i]))
        out = "y" if i == depth - 1 else f"t{i}"
        nodes.append(helper.make_node("Add", [previous, f"c{i}"], [out], name=f"add{i}"))
        previous = out
    return _model(nodes, [("x", [elements])], [("y", [elements])], inits)


def _fan(width: int) -> "onnx.ModelProto":
    from onnx import TensorProto, helper

    inits = [helper.make_tensor("c", TensorProto.FLOAT, [1], [1.0])]
    nodes = [helper.make_node("Add", [f"x{i}", "c"], [f"y{i}"], name=f"add{i}") for i in range(width)]
    return _model(nodes, [(f"x{i}", [1]) for i in range(width)], [(f"y{i}", [1]) for i in range(width)], inits)


def _matmul(size: int) -> "onnx.ModelProto":
    from onnx import helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(1).standard_normal((size, size)).astype(np.float32), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")
    return _model([node], [("x", [size, size])], [("y", [size, size])], [weight])


def _conv(side: int, channels: int) -> "onnx.ModelProto":
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(2)
    weight = numpy_helper.from_array((rng.standard_normal((channels, channels, 3, 3)) * 0.1).astype(np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])
    shape = [1, channels, side, side]
    return _model([node], [("x", shape)], [("y", shape)], [weight])


def _model(nodes: list, inputs: list[tuple[str, list[int]]], outputs: list[tuple[str, list[int]]],
           initializers: list) -> "onnx.ModelProto":
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "calibration",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model
