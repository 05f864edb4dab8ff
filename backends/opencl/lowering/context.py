"""What an op's lowering sees: shapes, host-known values, and a way to emit kernels.

Lowerings never touch OpenCL; they add tensors, views, constants and
:class:`KernelStep`\\ s to a :class:`Program`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from backends.opencl.plan import KernelStep, Program, Storage, TensorRef, Variant, elems_of, shape_text

if TYPE_CHECKING:
    import numpy as np
    import onnx


class NotLowerableError(Exception):
    """A node cannot be compiled as specialised (e.g. a Resize whose scales are runtime data).

    Internal: the compiler turns it into UnsupportedNodesError or BackendError.
    """


class LoweringContext:
    """Mutable state of one specialisation while nodes are lowered in order."""

    def __init__(self, program: Program, values: dict[str, "np.ndarray"], opset: int) -> None:
        self.program = program
        self.values = values
        self.opset = opset
        self._const_count = 0

    # -- reading -----------------------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        ref = self.program.tensors.get(name)
        if ref is not None:
            return ref.shape
        if name in self.values:
            return tuple(int(d) for d in self.values[name].shape)
        raise NotLowerableError(f"tensor {name!r} has no known shape")

    def has_value(self, name: str) -> bool:
        return bool(name) and name in self.values

    def value(self, name: str, what: str) -> "np.ndarray":
        """The host value of ``name``; raises NotLowerableError naming ``what`` if it is runtime data."""
        if not self.has_value(name):
            raise NotLowerableError(f"{what} ({name!r}) must be known at compile time")
        return self.values[name]

    def optional_value(self, node: "onnx.NodeProto", slot: int, what: str) -> "np.ndarray | None":
        if len(node.input) <= slot or not node.input[slot]:
            return None
        return self.value(node.input[slot], what)

    # -- creating ------------------------------------------------------------------
    def _storage(self, elems: int, kind: str, host: "np.ndarray | None" = None) -> int:
        sid = len(self.program.storages)
        self.program.storages.append(Storage(sid, max(elems, 1), kind, host))
        return sid

    def device(self, name: str) -> str:
        """``name`` as a device tensor; host-known values are uploaded as constants."""
        if name in self.program.tensors:
            return name
        if name in self.values:
            import numpy as np

            array = np.ascontiguousarray(self.values[name], dtype=np.float32)
            sid = self._storage(array.size, "const", array)
            self.program.tensors[name] = TensorRef(sid, tuple(array.shape))
            return name
        raise NotLowerableError(f"tensor {name!r} is not available")

    def constant(self, hint: str, array: "np.ndarray") -> str:
        """A new device constant (packed weights, folded parameters); returns its name."""
        import numpy as np

        self._const_count += 1
        name = f"{hint}#const{self._const_count}"
        array = np.ascontiguousarray(array, dtype=np.float32)
        sid = self._storage(array.size, "const", array)
        self.program.tensors[name] = TensorRef(sid, tuple(array.shape))
        return name

    def output(self, name: str, shape: tuple[int, ...]) -> str:
        """A fresh device tensor for a node output."""
        sid = self._storage(elems_of(shape), "temp")
        self.program.tensors[name] = TensorRef(sid, tuple(int(d) for d in shape))
        return name

    def input(self, name: str, shape: tuple[int, ...]) -> None:
        sid = self._storage(elems_of(shape), "input")
        self.program.tensors[name] = TensorRef(sid, tuple(shape))
        self.program.inputs[name] = name

    def view(self, name: str, source: str, shape: tuple[int, ...]) -> None:
        """``name`` reads ``source``'s memory with another shape (Reshape, Squeeze...)."""
        shape = tuple(int(d) for d in shape)
        if self.has_value(source):
            self.values[name] = self.values[source].reshape(shape)
            return
        ref = self.program.tensors[self.device(source)]
        if elems_of(ref.shape) != elems_of(shape):
            raise NotLowerableError(
                f"cannot view {shape_text(ref.shape)} as {shape_text(shape)}: element counts differ")
        self.program.tensors[name] = TensorRef(ref.sid, shape)

    def emit(self, family: str, entry: str, args: list[str], variants: list[Variant], *,
             label: str, shapes: tuple[tuple[int, ...], ...], flops: int = 0,
             tune_key: str = "") -> None:
        for arg in args:
            self.device(arg)
        self.program.steps.append(KernelStep(
            family=family, entry=entry, args=tuple(args), variants=tuple(variants), label=label,
            shape=shape_text(*shapes), flops=int(flops), tune_key=tune_key))


def int_list(value: Any) -> list[int]:
    """A host value or attribute as a list of Python ints."""
    import numpy as np

    return [int(v) for v in np.asarray(value).reshape(-1)]


def define(key: str, value: Any) -> tuple[str, str]:
    """One instance define; bools become 0/1 and floats exact literals."""
    import numbers

    from backends.opencl.plan import render_float

    if isinstance(value, (bool, numbers.Integral)):
        return key, str(int(value))
    if isinstance(value, numbers.Real):
        return key, render_float(float(value))
    return key, str(value)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


FLAT_LOCAL = 64  # work-group size of 1-D kernels; every OpenCL GPU allows at least this


def flat_variant(defines: list[tuple[str, str]], count: int) -> "Variant":
    """A 1-D launch of ``count`` work-items (rounded up to whole work-groups)."""
    return Variant(tuple(defines), (max(ceil_div(count, FLAT_LOCAL), 1) * FLAT_LOCAL,), (FLAT_LOCAL,))
