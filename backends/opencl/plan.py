"""The device program of one specialisation, as plain data.

Lowering turns ONNX nodes into :class:`KernelStep`\\ s over named tensors;
each tensor lives in a :class:`Storage` (views such as Reshape share their
source's storage). The memory plan maps temporary storages to device buffers,
and the executable enqueues the steps in order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

Defines = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Variant:
    """One way to launch a kernel: its instance defines and NDRange.

    ``entry`` names another kernel of the step's family taking the same
    arguments (an alternative algorithm); empty means the step's own.
    """

    defines: Defines
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None = None
    entry: str = ""


@dataclass(frozen=True)
class KernelStep:
    """One kernel launch: ``family``.cl's ``entry`` over the named tensor buffers.

    ``variants`` holds one launch, or several tuning candidates that compute
    the same result; ``tune_key`` names the work they share (op and shapes).
    """

    family: str
    entry: str
    args: tuple[str, ...]
    variants: tuple[Variant, ...]
    label: str
    shape: str
    flops: int = 0
    tune_key: str = ""


@dataclass
class Storage:
    """Device memory behind one or more tensors (a tensor and its views).

    ``kind`` is ``"input"`` (written from the host each run), ``"temp"``
    (planned) or ``"const"`` (uploaded once from ``host``).
    """

    sid: int
    elems: int
    kind: str
    host: "np.ndarray | None" = None


@dataclass(frozen=True)
class TensorRef:
    """A tensor: the storage it reads from and its logical shape."""

    sid: int
    shape: tuple[int, ...]


@dataclass
class Program:
    """Everything one specialisation needs to run, before any device object exists."""

    steps: list[KernelStep] = field(default_factory=list)
    storages: list[Storage] = field(default_factory=list)
    tensors: dict[str, TensorRef] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)  # graph input -> tensor name
    outputs: list[str] = field(default_factory=list)  # graph output names, in order
    host_outputs: dict[str, "np.ndarray"] = field(default_factory=dict)  # folded outputs
    fused: list[str] = field(default_factory=list)  # labels of fused node groups
    folded_nodes: int = 0


def elems_of(shape: tuple[int, ...]) -> int:
    return int(math.prod(shape))


def render_float(value: float) -> str:
    """An OpenCL C float literal that round-trips float32 exactly (inf/nan included)."""
    import numpy as np

    as32 = np.float32(value)
    if np.isnan(as32):
        return "NAN"
    if np.isinf(as32):
        return "INFINITY" if as32 > 0 else "(-INFINITY)"
    if as32 == 0:
        return "0.0f"
    literal = f"{float(as32).hex()}f"
    return f"({literal})" if as32 < 0 else literal


def shape_text(*shapes: tuple[int, ...]) -> str:
    """``"1x3x224x224, 16x3x3x3"`` for error messages and describe()."""
    return ", ".join("x".join(str(d) for d in s) or "scalar" for s in shapes)
