"""Activations, broadcasting binary ops and inference BatchNormalization."""

from __future__ import annotations

import numpy as np

from backends.opencl.attrs import node_attrs
from backends.opencl.lowering import NodeGroup
from backends.opencl.lowering.context import LoweringContext, define, flat_variant
from backends.opencl.lowering.epilogue import BINARY_TEMPLATES, compose
from backends.opencl.lowering.index import broadcast_offset
from backends.opencl.plan import elems_of

_BINOPS = {op: template.format(a="a", b="b") for op, template in BINARY_TEMPLATES.items()}


def lower_unary(ctx: LoweringContext, group: NodeGroup) -> None:
    """An activation chain with no producer to fuse into: one pass over the tensor."""
    x = group.head.input[0]
    shape = ctx.shape(x)
    out = ctx.output(group.out, shape)
    count = elems_of(shape)
    defines = [define("COUNT", count), *compose([group.head, *group.activations], ctx, x)]
    ctx.emit("elementwise", "unary", [x, out], [flat_variant(defines, count)],
             label=group.label, shapes=(shape,), flops=count)


def lower_binary(ctx: LoweringContext, group: NodeGroup) -> None:
    a, b = group.head.input[0], group.head.input[1]
    a_shape, b_shape = ctx.shape(a), ctx.shape(b)
    try:
        out_shape = tuple(int(d) for d in np.broadcast_shapes(a_shape, b_shape))
    except ValueError as exc:
        from backends.opencl.lowering.context import NotLowerableError

        raise NotLowerableError(f"shapes {a_shape} and {b_shape} do not broadcast") from exc
    out = ctx.output(group.out, out_shape)
    count = elems_of(out_shape)
    defines = [
        define("COUNT", count), ("BINOP(a, b)", _BINOPS[group.head.op_type]),
        ("A_OFF(i)", broadcast_offset(a_shape, out_shape)),
        ("B_OFF(i)", broadcast_offset(b_shape, out_shape)), *group.activate(ctx),
    ]
    ctx.emit("elementwise", "binary", [a, b, out], [flat_variant(defines, count)],
             label=group.label, shapes=(a_shape, b_shape), flops=count)


def lower_batchnorm(ctx: LoweringContext, group: NodeGroup) -> None:
    node = group.head
    x, scale, bias, mean, var = node.input[:5]
    shape = ctx.shape(x)
    out = ctx.output(group.out, shape)
    count = elems_of(shape)
    channels = shape[1] if len(shape) > 1 else 1
    defines = [define("COUNT", count), define("C", channels),
               define("INNER", elems_of(shape[2:])),
               define("EPS", float(node_attrs(node).get("epsilon", 1e-5))), *group.activate(ctx)]
    ctx.emit("elementwise", "batchnorm", [x, scale, bias, mean, var, out],
             [flat_variant(defines, count)], label=group.label, shapes=(shape,), flops=2 * count)


LOWERINGS = {op: lower_binary for op in _BINOPS}
LOWERINGS.update({op: lower_unary for op in (
    "Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Gelu",
    "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Softplus", "Elu", "Sin", "Cos")})
LOWERINGS["BatchNormalization"] = lower_batchnorm
