"""The backend contract: how a model (or a subgraph of it) gets executed.

Every backend is an object with a ``name`` and three methods; every compiled
result is an :class:`Executable`. Backends are synchronous; the runtime
calls them from worker threads. Backends never import each other nor
``edge_runtime``.

Required::

    availability() -> Availability        usable here? if not, one line why
    supports(node, shapes) -> bool        can this ONNX node run here?
    compile(model, options) -> Executable whole model or extracted subgraph

Optional (``Backend``)::

    claims(model, shapes) -> frozenset[int]   (optional) default: supports() per node
                                    (the whole-graph answer, where the engine places a graph at once)

Optional (``Executable``)::

    backend_nodes: dict[str, int]   (optional) default: {backend name: node count}
    describe() -> dict              (optional) default: {"backend": name}
    device: str                     (optional) default: the descriptor's ``device``
                                    (a TFLite model on a GPU delegate says "gpu")

Every backend is described once by a :class:`BackendDescriptor`
(``backends.descriptors``); the scheduler, planner, catalogue check and CLI read
that instead of keeping their own lists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Union, runtime_checkable

if TYPE_CHECKING:  # onnx is heavy; only type checkers need it here
    import numpy as np
    import onnx

Dim = Union[int, str, None]
"""A dimension: a fixed size, a symbolic name (``"batch"``), or unknown."""

ModelSource = Union["onnx.ModelProto", str, os.PathLike]
"""What ``compile`` takes: an in-memory ONNX model or a model file path."""


DEVICE_KINDS = ("cpu", "gpu", "cloud")
MODEL_FORMATS = ("onnx", "tflite")


@dataclass(frozen=True)
class BackendDescriptor:
    """Static facts about one backend, readable without importing it.

    ``device``: where its work lands by default (one of DEVICE_KINDS); an
    executable may say otherwise through its optional ``device`` attribute.
    ``api``: the native interface it drives ("onnxruntime", "opencl", "vulkan",
    "litert", "ncnn", ...). ``formats``: model files it compiles (MODEL_FORMATS).
    ``thread_safe``: one executable may be run from several threads at once.
    ``selectable``: a user may name it (``--backend``, ``backend = ...``); test
    stand-ins and stage labels such as ``cloud`` are not.
    """

    name: str
    device: str
    api: str
    formats: tuple[str, ...]
    thread_safe: bool = False
    selectable: bool = True

    def __post_init__(self) -> None:
        if self.device not in DEVICE_KINDS:
            raise ValueError(f"backend {self.name!r}: device must be one of {DEVICE_KINDS}, got {self.device!r}")
        unknown = [f for f in self.formats if f not in MODEL_FORMATS]
        if unknown or not self.formats:
            raise ValueError(f"backend {self.name!r}: formats must be from {MODEL_FORMATS}, got {self.formats!r}")

    def takes(self, model_format: str) -> bool:
        """Whether this backend compiles models of ``model_format`` ("onnx", "tflite")."""
        return model_format in self.formats


@dataclass(frozen=True)
class TensorSpec:
    """Name, numpy dtype name (``"float32"``) and shape of a graph input/output."""

    name: str
    dtype: str
    shape: tuple[Dim, ...]

    def is_static(self) -> bool:
        return all(isinstance(d, int) and d >= 0 for d in self.shape)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here; ``reason`` is one line either way."""

    ok: bool
    reason: str
    device: str = ""

    @classmethod
    def yes(cls, device: str, reason: str = "available") -> "Availability":
        return cls(True, reason, device)

    @classmethod
    def no(cls, reason: str) -> "Availability":
        return cls(False, reason, "")


@dataclass(frozen=True)
class DelegateSpec:
    """A TFLite external delegate: shared library path and its string options."""

    library: str
    options: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class CompileOptions:
    """Typed options every backend understands; a backend ignores what it cannot use.

    ``intra_op_threads`` None means "the backend decides" (all usable cores).
    ``cache_dir`` None disables on-disk caches. ``precision`` is ``"fp32"`` or
    ``"fp16"`` (opt-in where the device supports it).
    """

    intra_op_threads: int | None = None
    cache_dir: Path | None = None
    precision: str = "fp32"
    delegates: tuple[DelegateSpec, ...] = ()
    cache_key_extra: str = ""  # device/build fingerprint folded into cache keys
    # CPU thread pools busy-wait between ops by default; off when a scheduler shares the
    # cores with an event loop (spinning threads starve it on 2-4 cores).
    allow_spinning: bool = True
    # With ``allow_spinning``: pool threads spin only while a run is in flight and stop the moment
    # the last concurrent run returns (ONNX Runtime's ``session.force_spinning_stop``), so an idle
    # model burns no core; a backend without that means does not spin at all.
    spin_only_in_runs: bool = False
    # With ``allow_spinning``: the longest a pool thread spins waiting for work before it sleeps
    # (ONNX Runtime's ``session.intra_op.spin_duration_us``); 0: the library's default.
    spin_duration_us: int = 0


@runtime_checkable
class Executable(Protocol):
    """A compiled model or subgraph, ready to run."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    def run(self, feeds: Mapping[str, "np.ndarray"]) -> dict[str, "np.ndarray"]:
        """Run once; feeds are already validated by the runtime. Raises BackendError."""
        ...

    def close(self) -> None:
        """Release native resources; idempotent."""
        ...


@runtime_checkable
class Backend(Protocol):
    """One way of executing ONNX (or TFLite) models."""

    name: str

    def availability(self) -> Availability:
        ...

    def supports(self, node: "onnx.NodeProto", shapes: Mapping[str, TensorSpec]) -> bool:
        """Whether this backend computes ``node`` correctly given known tensor specs."""
        ...

    def compile(self, model: ModelSource, options: CompileOptions) -> Executable:
        """Compile a model; raises UnsupportedNodesError, ModelLoadError or BackendError."""
        ...


def claimed_indices(backend: Backend, model: "onnx.ModelProto", shapes: Mapping[str, TensorSpec]) -> frozenset[int]:
    """Indices of ``model``'s nodes that ``backend`` takes: its optional ``claims``, else ``supports`` per node."""
    claims = getattr(backend, "claims", None)
    if callable(claims):
        return frozenset(claims(model, shapes))
    return frozenset(i for i, node in enumerate(model.graph.node) if backend.supports(node, shapes))


def backend_nodes_of(executable: Executable, default_backend: str, node_count: int) -> dict[str, int]:
    """The optional ``backend_nodes`` of an executable, or its documented default."""
    counts = getattr(executable, "backend_nodes", None)
    if counts:
        return dict(counts)
    return {default_backend: node_count}


def describe_of(executable: Executable, default_backend: str) -> dict[str, Any]:
    """The optional ``describe()`` of an executable, or its documented default."""
    describe = getattr(executable, "describe", None)
    if callable(describe):
        return dict(describe())
    return {"backend": default_backend}
