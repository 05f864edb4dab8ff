"""The OpenCL executable: specialisations per input signature, kept in a small LRU.

A signature is the feeds' shapes plus the values of value-bound inputs; the
first run with a new signature specialises (folds, lowers, tunes, builds) and
later runs with it reuse the built program.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Hashable, Mapping

import numpy as np

from backends.base import TensorSpec
from backends.errors import BackendError, InvalidInputError, UnsupportedNodesError
from backends.opencl.compiler import SpecialisationError, specialise
from backends.opencl.device import describe_info
from backends.opencl.fusion import Group
from backends.opencl.graph import GraphAnalysis
from backends.opencl.runner import PreparedProgram

log = logging.getLogger(__name__)

Signature = Hashable
MakeRunner = Callable[..., PreparedProgram]


class OpenCLExecutable:
    """Runs an analysed graph on the device; ``close()`` releases every specialisation."""

    def __init__(self, analysis: GraphAnalysis, groups: list[Group], make_runner: MakeRunner, *,
                 device_info: Any, precision: str, stats: Any, max_specialisations: int,
                 model_label: str) -> None:
        self.inputs: list[TensorSpec] = list(analysis.inputs)
        self.outputs: list[TensorSpec] = list(analysis.outputs)
        self.backend_nodes = {"opencl": len(analysis.model.graph.node)}
        self._analysis = analysis
        self._groups = groups
        self._make_runner = make_runner
        self._device_info = device_info
        self._precision = precision
        self._stats = stats
        self._max = max(1, max_specialisations)
        self._label = model_label
        self._cache: OrderedDict[Signature, PreparedProgram] = OrderedDict()
        self._consts: dict[str, Any] = {}  # device weights shared by the specialisations
        self._lock = threading.Lock()
        self._closed = False
        self.specialisations_built = 0

    def signature(self, feeds: Mapping[str, np.ndarray]) -> tuple[Signature, dict[str, tuple[int, ...]], dict[str, np.ndarray]]:
        shapes, values = {}, {}
        for spec in self.inputs:
            if spec.name not in feeds:
                raise InvalidInputError(f"opencl: missing input {spec.name!r}")
            array = np.asarray(feeds[spec.name])
            if len(array.shape) != len(spec.shape) or any(
                    isinstance(d, int) and d >= 0 and d != s for d, s in zip(spec.shape, array.shape)):
                raise InvalidInputError(
                    f"opencl: input {spec.name!r} expects shape {list(spec.shape)}, got {list(array.shape)}")
            if spec.name in self._analysis.value_inputs:
                values[spec.name] = array
            else:
                shapes[spec.name] = tuple(int(d) for d in array.shape)
        key = (tuple(sorted(shapes.items())),
               tuple((n, v.dtype.str, v.shape, v.tobytes()) for n, v in sorted(values.items())))
        return key, shapes, values

    def prepare(self, shapes: dict[str, tuple[int, ...]], values: dict[str, np.ndarray],
                key: Signature | None = None, at_compile: bool = False) -> PreparedProgram:
        """The specialisation for these shapes/values, built on first use.

        Raises UnsupportedNodesError (at compile) or BackendError (at run) when
        a node cannot be specialised.
        """
        if key is None:
            key = (tuple(sorted(shapes.items())), tuple(
                (n, v.dtype.str, v.shape, v.tobytes()) for n, v in sorted(values.items())))
        with self._lock:
            if self._closed:
                raise BackendError("opencl: executable is closed")
            runner = self._cache.get(key)
            if runner is not None:
                self._cache.move_to_end(key)
                return runner
            started = time.perf_counter()
            try:
                program = specialise(self._analysis, self._groups, shapes, values)
            except SpecialisationError as exc:
                reasons = "; ".join(f"{label}: {reason}" for label, reason in exc.problems.items())
                if at_compile:
                    log.warning("opencl: cannot compile %s: %s", self._label, reasons)
                    error = UnsupportedNodesError("opencl", [k for k in exc.problems if not k.startswith("output ")])
                    error.reasons = dict(exc.problems)  # type: ignore[attr-defined]
                    raise error from exc
                raise BackendError(f"opencl: cannot specialise {self._label} for shapes {shapes}: "
                                   f"{reasons}") from exc
            runner = self._make_runner(program, label=self._label, plan_s=time.perf_counter() - started,
                                       const_pool=self._consts)
            self.specialisations_built += 1
            self._cache[key] = runner
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
            return runner

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        key, shapes, values = self.signature(feeds)
        runner = self.prepare(shapes, values, key)
        return runner.run(feeds)

    def describe(self) -> dict[str, Any]:
        with self._lock:
            specs = [runner.describe() for runner in self._cache.values()]
        return {
            "backend": "opencl", "device": describe_info(self._device_info),
            "precision": self._precision, "nodes": self.backend_nodes["opencl"],
            "device_nodes": len(self._analysis.runtime), "folded_nodes": len(self._analysis.folded),
            "value_bound_inputs": sorted(self._analysis.value_inputs),
            "specialisations": specs, "compile_stats": self._stats.snapshot(),
        }

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._cache.clear()
            self._consts.clear()

    def profile(self, feeds: Mapping[str, np.ndarray], repeats: int = 5) -> list[dict[str, Any]]:
        """(optional hook) Per-kernel device time for ``feeds``' shapes: OpenCL event profiling, best of ``repeats``.

        Rows as ``PreparedProgram.profile`` gives them (``label``, ``kernel``, ``shape``, ``best_us``).
        """
        key, shapes, values = self.signature(feeds)
        runner = self.prepare(shapes, values, key)
        runner.run(feeds)  # the buffers then hold this request's data
        return runner.profile(repeats)
