"""Backend speed calibration: a short micro-benchmark through the backend contract.

Tiny ONNX models (``micro_models``) are compiled on the backend and timed
(best of a few runs, within a time budget, ~2 s at most):

* ``add_chain(1, 1)`` / ``add_chain(1, K)``: one vs K chained Adds on one
  element give the fixed cost of a run and the per-node launch cost (each node
  also reads the graph input, so no fuser can merge the chain into one kernel);
* ``fan(4)``: four one-element inputs and outputs give the per-tensor copy
  latency (device backends);
* ``add_chain(N, 1)`` / ``add_chain(N, K)`` on N floats give memory bandwidth
  and, on a device backend, host<->device copy bandwidth;
* ``matmul(S)`` and a 3x3 ``conv`` give compute speeds (GFLOP/s): matrix
  products and convolutions run at rather different speeds on some backends.

Every figure is checked against ``calibration_bounds`` (launch cost > 0,
bandwidth within what the host moves, ...): out of bounds, the whole set is
measured once more; a figure still out is refused with a WARNING naming it,
and ``default_speed``'s value stands in.

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
from edge_runtime.planning import micro_models
from edge_runtime.planning.calibration_bounds import host_bandwidth_gbps, out_of_bounds
from edge_runtime.planning.cost import BackendSpeed

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

CACHE_FILE = "calibration.json"
# Bump when the micro-models or the checks change, so stale entries are measured again.
# 3: chains no fuser can merge; sanity bounds (format 2 let PoCL read 0.0 us per node and 3,813 GB/s).
_FORMAT = 3
_BIG_ELEMS = 1 << 20
_CHAIN = 8
_LONG_CHAIN = 32  # the one-element chain that gives the launch cost
_FAN = 4
_MATMUL = 256
_CONV = (32, 32)  # 3x3 convolution, 32 -> 32 channels on a 32x32 image: 19 MFLOP

SpeedMeasure = Callable[[Backend, CompileOptions, bool], BackendSpeed]
Figures = dict[str, "float | None"]


def default_speed(name: str, on_host: bool) -> BackendSpeed:
    """Assumed speed when measuring is impossible: a modest phone CPU, or a device behind copies."""
    if on_host:
        return BackendSpeed(name, gflops=20.0, mem_gbps=8.0, launch_us=5.0, stage_us=20.0)
    return BackendSpeed(name, gflops=20.0, mem_gbps=8.0, launch_us=20.0, stage_us=50.0,
                        copy_gbps=4.0, copy_latency_us=20.0)


def own_memory(backend: Backend) -> bool:
    """Whether ``backend``'s device has memory of its own (a discrete GPU); backends say so through an
    optional ``own_memory()`` (the OpenCL backend does); others share the host's memory."""
    probe = getattr(backend, "own_memory", None)
    try:
        return bool(probe()) if probe is not None else False
    except Exception:  # an unusable device calibrates to defaults anyway; the host bound is the safe one
        return False


def measure_speed(backend: Backend, options: CompileOptions, on_host: bool, budget_s: float = 2.0) -> BackendSpeed:
    """Time the micro-models on ``backend``; raises EdgeRuntimeError if it cannot run them.

    Past ``budget_s`` each model runs only twice, and the optional ones (the
    copy-latency fan, the conv) are skipped; kernel builds still take what they
    take. Figures outside ``calibration_bounds`` are measured once more; those
    still out are replaced by ``default_speed``'s, with a WARNING naming each.
    """
    host_gbps = host_bandwidth_gbps(_BIG_ELEMS)
    own = own_memory(backend)
    figures = _measure_figures(backend, options, on_host, budget_s)
    bad = out_of_bounds(figures, host_gbps, own)
    if bad:
        log.info("calibration of %s: %s out of bounds (%s); measuring again", backend.name, ", ".join(bad),
                 "; ".join(f"{k} {why}" for k, why in bad.items()))
        again = _measure_figures(backend, options, on_host, budget_s)
        for name in bad:
            figures[name] = again[name]
        bad = out_of_bounds(figures, host_gbps, own)
    fallback = default_speed(backend.name, on_host).to_dict()
    for name, why in bad.items():
        log.warning("calibration of %s: refusing figure %s (%s, measured twice); using the default %s",
                    backend.name, name, why, fallback[name])
        figures[name] = fallback[name]
    return BackendSpeed(backend.name, **figures)  # type: ignore[arg-type]


def _measure_figures(backend: Backend, options: CompileOptions, on_host: bool, budget_s: float) -> Figures:
    """One pass over the micro-models: the raw figures of ``BackendSpeed`` (unchecked, may be impossible)."""
    options = dataclasses.replace(options, cache_dir=None)  # micro-models must not fill the model cache
    deadline = time.perf_counter() + budget_s

    def best(model: "onnx.ModelProto") -> float:
        return _best_times(backend, options, [model], deadline)[0]

    # NOTE: a kernel launch costs microseconds against tens of microseconds of noise per run on a
    # busy small device: a long chain, many interleaved rounds (the one-element runs are cheap).
    small_1, small_k = _best_times(backend, options, [micro_models.add_chain(1, 1),
                                                      micro_models.add_chain(1, _LONG_CHAIN)], deadline, 20)
    big_1, big_k = _best_times(backend, options, [micro_models.add_chain(_BIG_ELEMS, 1),
                                                  micro_models.add_chain(_BIG_ELEMS, _CHAIN)], deadline)
    launch_s = (small_k - small_1) / (_LONG_CHAIN - 1)
    add_mem_s = (big_k - big_1) / (_CHAIN - 1) - launch_s
    fixed_s = small_1 - launch_s
    copy_gbps, copy_latency_s = None, 0.0
    if not on_host:
        if time.perf_counter() < deadline:
            fan = best(micro_models.fan(_FAN))
            # fan(4) copies 3 more inputs and 3 more outputs than one node, and launches 3 more nodes.
            copy_latency_s = max(0.0, (fan - small_1 - (_FAN - 1) * launch_s) / (2 * (_FAN - 1)))
            # NOTE: on PoCL each extra tensor costs more than the one-in-one-out run's share
            # (fan - small_1 > 6 x ...): the per-tensor figure is kept (it makes cuts dearer, the
            # safe side) and the fixed cost floors at 0 rather than going negative.
            fixed_s = max(0.0, fixed_s - 2 * copy_latency_s)
        big_copy_s = (big_1 - small_1 - max(add_mem_s, 0.0)) / 2  # one way, N floats
        copy_gbps = _rate(4.0 * _BIG_ELEMS, big_copy_s)

    def gflops(model: "onnx.ModelProto", flops: float, io_bytes: float) -> float:
        """FLOP/s of one compute-bound micro-model, its fixed cost and copies taken out."""
        moved_s = 0.0 if not copy_gbps or copy_gbps == float("inf") else io_bytes / (copy_gbps * 1e9)
        return _rate(flops, best(model) - small_1 - moved_s)

    side, ch = _CONV
    conv_gflops = None
    matmul_gflops = gflops(micro_models.matmul(_MATMUL), 2.0 * _MATMUL**3, 8.0 * _MATMUL**2)
    if time.perf_counter() < deadline:
        conv_gflops = gflops(micro_models.conv(side, ch), 2.0 * side * side * ch * ch * 9, 8.0 * side * side * ch)
    mem_gbps = _rate(micro_models.CHAIN_BYTES_PER_ELEMENT * _BIG_ELEMS, add_mem_s)
    return {"gflops": matmul_gflops, "mem_gbps": mem_gbps, "launch_us": launch_s * 1e6, "stage_us": fixed_s * 1e6,
            "copy_gbps": copy_gbps, "copy_latency_us": copy_latency_s * 1e6, "conv_gflops": conv_gflops}


def _rate(amount: float, seconds: float) -> float:
    """``amount / seconds`` in units of 1e9; infinite when the time is not positive (then out of bounds)."""
    return amount / seconds / 1e9 if seconds > 0 else float("inf")


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
            speed = BackendSpeed.from_dict(entries[key])
            bad = out_of_bounds(speed.to_dict(), host_bandwidth_gbps(_BIG_ELEMS), own_memory(backend))
            if not bad:
                return speed
            raise ValueError("; ".join(f"{k} {why}" for k, why in bad.items()))
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
        write_entry(path, key, {**speed.to_dict(), "host_gbps": round(host_bandwidth_gbps(_BIG_ELEMS), 2),
                                "measured_at": time.time()})
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
    """Merge one entry into the cache file atomically (other processes may write too).

    Best effort: a read-only or full cache directory costs a re-measurement next
    start, never the load (logged).
    """
    entries = read_entries(path)
    entries[key] = entry
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot write calibration cache %s (%s); it will be measured again", path, exc)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            log.debug("cannot remove %s", tmp)


def _best_times(backend: Backend, options: CompileOptions, models: "list[onnx.ModelProto]", deadline: float,
                repeat: int = 5) -> list[float]:
    """Least wall seconds of each model over ``repeat`` interleaved rounds (the least is the least
    disturbed by a noisy machine; interleaving puts a drift of the machine's speed on every side alike)."""
    from backends.onnx_graph import graph_inputs, node_label, tensor_specs

    for model in models:
        specs = tensor_specs(model)
        refused = [node_label(n, i) for i, n in enumerate(model.graph.node) if not backend.supports(n, specs)]
        if refused:
            raise UnsupportedNodesError(backend.name, refused)
    executables = []
    try:
        runs = []
        rng = np.random.default_rng(0)
        for model in models:
            executable = backend.compile(model, options)
            executables.append(executable)
            feeds = {spec.name: rng.standard_normal([int(d) for d in spec.shape]).astype(np.float32)
                     for spec in graph_inputs(model)}
            executable.run(feeds)  # warm-up: first-run allocation and kernel builds
            runs.append((executable, feeds))
        best = [float("inf")] * len(models)
        for i in range(repeat):
            if i >= 2 and time.perf_counter() > deadline:
                break
            for k, (executable, feeds) in enumerate(runs):
                start = time.perf_counter()
                executable.run(feeds)
                best[k] = min(best[k], time.perf_counter() - start)
        return best
    finally:
        for executable in executables:
            executable.close()
