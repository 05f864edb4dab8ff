"""ONNX node groups -> kernel steps, one module per op family.

Each lowering is ``fn(ctx, group)``: it reads input shapes and host-known
values from ``ctx``, computes output shapes, and emits kernel steps (or
views) writing ``group.out`` and the head's other outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from backends.opencl.lowering.context import LoweringContext, NotLowerableError
from backends.opencl.lowering.epilogue import compose

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True)
class NodeGroup:
    """A fusion group with its nodes resolved (see backends.opencl.fusion)."""

    head: "onnx.NodeProto"
    batchnorm: "onnx.NodeProto | None"
    bias_add: "onnx.NodeProto | None"
    activations: tuple["onnx.NodeProto", ...]
    label: str
    residual: "onnx.NodeProto | None" = None

    @property
    def out(self) -> str:
        """The tensor the whole group produces (its last member's first output)."""
        for node in (*reversed(self.activations), self.residual, self.bias_add, self.batchnorm):
            if node is not None:
                return node.output[0]
        return self.head.output[0]

    @property
    def residual_input(self) -> str:
        """The tensor a fused residual Add reads ("" when there is none)."""
        if self.residual is None:
            return ""
        before = self.bias_add or self.batchnorm or self.head
        return [n for n in self.residual.input if n != before.output[0]][0]

    @property
    def head_out(self) -> str:
        """The tensor the epilogue reads: the head's result (after a fused BN, bias, residual)."""
        for node in (self.residual, self.bias_add, self.batchnorm):
            if node is not None:
                return node.output[0]
        return self.head.output[0]

    def activate(self, ctx: LoweringContext) -> tuple[tuple[str, str], ...]:
        """The ``ACTIVATE(v)`` defines of the fused element-wise epilogue."""
        return compose(list(self.activations), ctx, self.head_out)

    def without_bias(self) -> "NodeGroup":
        """The head alone, writing its own output (when a fused bias does not fit)."""
        return NodeGroup(self.head, self.batchnorm, None, (), self.label)

    def residual_args(self, ctx: LoweringContext, out_shape: tuple[int, ...]) -> tuple[list[str], list[tuple[str, str]]]:
        """Kernel args and defines of the fused residual (``HAS_RES``)."""
        from backends.opencl.lowering.context import define

        if self.residual is None:
            return [], [define("HAS_RES", False)]
        name = self.residual_input
        if ctx.shape(name) != tuple(out_shape):
            raise NotLowerableError(f"residual {name!r} has shape {ctx.shape(name)}, output {out_shape}")
        return [name], [define("HAS_RES", True)]


Lowering = Callable[[LoweringContext, NodeGroup], None]


def _registry() -> dict[str, Lowering]:
    from backends.opencl.lowering import conv, elementwise, layout, linear, normalize, pool, resize

    table: dict[str, Lowering] = {}
    for module in (conv, elementwise, layout, linear, normalize, pool, resize):
        table.update(module.LOWERINGS)
    return table


_TABLE: dict[str, Lowering] = {}


def lower_group(ctx: LoweringContext, group: NodeGroup) -> None:
    """Lower one group; raises NotLowerableError when it cannot be specialised."""
    if not _TABLE:
        _TABLE.update(_registry())
    fn = _TABLE.get(group.head.op_type)
    if fn is None:
        raise NotLowerableError(f"no lowering for {group.head.op_type}")
    fn(ctx, group)


__all__ = ["LoweringContext", "NodeGroup", "NotLowerableError", "lower_group"]
