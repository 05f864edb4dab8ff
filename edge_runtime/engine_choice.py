"""Which CPU engine runs a model under ``auto``: ONNX Runtime (``cpu``) or ``ncnn``.

Both run on the same cores, so the roofline cost model cannot tell them
apart: their speed ratio depends on the model's layers (ncnn is ahead on
MobileNet-style CNNs, ORT on others). So the choice is measured, per model
and input size: both executables run the seeded input in interleaved
rounds (best of each side), and the faster one (median of the rounds' bests) wins. The decision is
remembered in ``cache_dir/engine_choice.json`` keyed on the model bytes, the
input shapes, the device key and both engines' versions, so it is measured
once per device. The scheduler then keeps learning: a model loaded on
``ncnn`` still gets a ``cpu`` plan (``scheduler.factory``) and the cost
policy's moving averages pick between them per request.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from backends.base import Backend, CompileOptions
from backends.errors import EdgeRuntimeError
from edge_runtime.planning.calibration import read_entries, write_entry

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

CACHE_FILE = "engine_choice.json"
ROUNDS = 7
RUNS_PER_ROUND = 3
BUDGET_S = 4.0
_FORMAT = 1


@dataclass(frozen=True)
class EngineChoice:
    """The winner, best milliseconds of each engine measured, and a one-line reason."""

    backend: str
    best_ms: dict[str, float]
    reason: str
    raced: tuple[str, ...] = ()  # the engines besides cpu that took part
    from_cache: bool = False


def choose_engine(model: "onnx.ModelProto", engines: Mapping[str, Backend], options: CompileOptions,
                  shapes: Mapping[str, Sequence[int]], device_key: str, cache_dir: Path | None) -> EngineChoice:
    """Race ``engines`` (name -> backend; ``cpu`` first) on ``model`` at ``shapes``.

    An engine that cannot compile or run the model drops out with its reason
    in ``EngineChoice.reason``; ``cpu`` failing raises (it is the baseline).
    """
    key = _key(model, engines, shapes, device_key)
    raced = tuple(n for n in engines if n != "cpu")
    cached = read_entries(_path(cache_dir)).get(key)
    if isinstance(cached, dict) and cached.get("backend") in engines:
        return EngineChoice(cached["backend"], dict(cached.get("best_ms", {})), str(cached.get("reason", "")),
                            raced, from_cache=True)
    feeds = seeded_feeds(model, shapes)
    runners: dict[str, Callable[[], object]] = {}
    dropped: list[str] = []
    executables = []
    try:
        for name, backend in engines.items():
            try:
                executable = backend.compile(model, options)
                executables.append(executable)
                executable.run(feeds)  # warm-up: conversion, gate, first-run allocations
            except EdgeRuntimeError as exc:
                if name == "cpu":
                    raise
                dropped.append(f"{name}: {type(exc).__name__}: {exc}")
                continue
            if name != "cpu" and getattr(executable, "describe", None) and executable.describe().get("on_onnxruntime"):
                dropped.append(f"{name}: {executable.describe()['on_onnxruntime'][0]['reason']}")
                continue
            runners[name] = lambda e=executable: e.run(feeds)
        best = race_runners(runners)
    finally:
        for executable in executables:
            executable.close()
    winner = min(best, key=best.get)
    shown = ", ".join(f"{n} {ms:.3f} ms" for n, ms in best.items())
    reason = f"measured faster at {dict(shapes)}: {shown}" + (f"; dropped {'; '.join(dropped)}" if dropped else "")
    log.info("engine choice: %s (%s)", winner, reason)
    path = _path(cache_dir)
    if path is not None and not dropped:  # a failure may be transient (pnnx missing now): measure again
        write_entry(path, key, {"backend": winner, "best_ms": best, "reason": reason, "measured_at": time.time()})
    return EngineChoice(winner, best, reason, raced)


def race_runners(runners: Mapping[str, Callable[[], object]], budget_s: float = BUDGET_S,
                 rounds: int = ROUNDS, runs_per_round: int = RUNS_PER_ROUND) -> dict[str, float]:
    """Median over interleaved rounds of each runner's best-of-``runs_per_round`` wall ms.

    Best of a few drops a run disturbed by the other engine's threads winding
    down; the median over rounds drops rounds hit by other processes. At least
    three rounds run; past ``budget_s`` no new round starts. Shared by the plan
    race (``plan_race``).
    """
    bests: dict[str, list[float]] = {name: [] for name in runners}
    deadline = time.perf_counter() + budget_s
    names = list(runners)
    if not names:
        return {}
    for round_index in range(rounds):
        # Each round starts with the next runner: whatever one run leaves behind (threads winding
        # down, caches) falls on every runner in turn, not always on the one after it.
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            call = runners[name]
            best = float("inf")
            for _ in range(runs_per_round):
                start = time.perf_counter()
                call()
                best = min(best, (time.perf_counter() - start) * 1e3)
            bests[name].append(best)
        if round_index >= 2 and time.perf_counter() > deadline:
            break
    return {name: round(statistics.median(values), 4) for name, values in bests.items()}


def seeded_feeds(model: "onnx.ModelProto", shapes: Mapping[str, Sequence[int]],
                 sample: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Reproducible feeds (seed 0, uniform [0, 1) cast to each input's dtype) at ``shapes``; an input
    ``sample`` holds at that shape is its value instead. Integer and boolean inputs come out all zero,
    which describes no real input where their values steer the work (a vision encoder's patch grid
    or patch mask): the caller's ``sample`` (a typical image's feeds) does."""
    from backends.onnx_graph import graph_inputs

    rng = np.random.default_rng(0)
    feeds = {}
    for spec in graph_inputs(model):
        dtype = np.dtype(spec.dtype) if not spec.dtype.startswith("onnx:") else np.dtype(np.float32)
        shape = tuple(shapes[spec.name])
        given = (sample or {}).get(spec.name)
        feeds[spec.name] = (np.asarray(given, dtype) if given is not None and tuple(np.shape(given)) == shape
                            else rng.random(shape).astype(dtype))
    return feeds


def _key(model: "onnx.ModelProto", engines: Mapping[str, Backend], shapes: Mapping[str, Sequence[int]],
         device_key: str) -> str:
    import onnxruntime

    versions = {"onnxruntime": onnxruntime.__version__}
    if "ncnn" in engines or "ncnn_vulkan" in engines:
        import ncnn

        versions["ncnn"] = ncnn.__version__
    digest = hashlib.sha256(model.SerializeToString())
    digest.update(json.dumps({"engines": sorted(engines), "shapes": {k: list(v) for k, v in sorted(shapes.items())},
                              "device": device_key, "versions": versions, "format": _FORMAT}).encode())
    return digest.hexdigest()[:32]


def _path(cache_dir: Path | None) -> Path | None:
    return None if cache_dir is None else Path(cache_dir) / CACHE_FILE


def engine_for(runtime: object, model: "onnx.ModelProto", options: CompileOptions,
               input_shapes: Mapping[str, Sequence[int]] | None) -> EngineChoice | None:
    """The measured choice between ``cpu`` and the other CPU engines in the runtime's backend order.

    None when no other CPU engine is in the order, usable, and claims every
    node (nothing to race). ``runtime`` is a ``Runtime``.
    """
    from backends.onnx_graph import graph_inputs, tensor_specs
    from edge_runtime.planning.cost import bound_input_shapes

    raced = cpu_engines()
    candidates = [n for n in runtime.backend_order() if n in raced]  # type: ignore[attr-defined]
    engines: dict[str, Backend] = {}
    specs = None
    for name in candidates:
        if not runtime.availability(name).ok:  # type: ignore[attr-defined]
            continue
        backend = runtime.backend(name)  # type: ignore[attr-defined]
        specs = specs if specs is not None else tensor_specs(model)
        if all(backend.supports(node, specs) for node in model.graph.node):
            engines[name] = backend
    if not engines or not runtime.availability("cpu").ok:  # type: ignore[attr-defined]
        return None
    shapes = bound_input_shapes(graph_inputs(model), input_shapes)
    return choose_engine(model, {"cpu": runtime.backend("cpu"), **engines}, options,  # type: ignore[attr-defined]
                         shapes, runtime.device_key(), runtime.config.cache_dir)  # type: ignore[attr-defined]


def cpu_engines() -> frozenset[str]:
    """Selectable ONNX backends besides ``cpu`` whose work lands on the host cores (``ncnn``),
    read from the backend descriptors: these are raced against ``cpu`` under ``auto``."""
    from backends.descriptors import DESCRIPTORS

    return frozenset(n for n, d in DESCRIPTORS.items()
                     if n != "cpu" and d.device == "cpu" and d.selectable and d.takes("onnx"))
