"""Softmax/LogSoftmax, LayerNormalization and the Reduce* family."""

from __future__ import annotations

from typing import TYPE_CHECKING

from backends.opencl.attrs import node_attrs
from backends.opencl.lowering import NodeGroup
from backends.opencl.lowering.context import LoweringContext, NotLowerableError, define, flat_variant, int_list
from backends.opencl.lowering.index import broadcast_offset, offset_expr, strides
from backends.opencl.plan import Variant, elems_of

if TYPE_CHECKING:
    import onnx


ROW_GROUP_MIN = 64  # softmax rows at least this long get a work-group each (softmax_rows)


def _axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < max(rank, 1):
        raise NotLowerableError(f"{what} axis {axis} out of range for rank {rank}")
    return axis % max(rank, 1)


def lower_softmax(ctx: LoweringContext, group: NodeGroup) -> None:
    node = group.head
    x = node.input[0]
    shape = ctx.shape(x)
    attrs = node_attrs(node)
    if ctx.opset >= 13:
        axis = _axis(int(attrs.get("axis", -1)), len(shape), node.op_type)
        length, inner = shape[axis] if shape else 1, elems_of(shape[axis + 1:])
    else:  # opset < 13: the input is coerced to 2-D at axis
        axis = _axis(int(attrs.get("axis", 1)), len(shape), node.op_type)
        length, inner = elems_of(shape[axis:]), 1
    out = ctx.output(group.out, shape)
    rows = elems_of(shape) // max(length, 1)
    defines = [define("COUNT", rows), define("AXIS", length), define("INNER", inner),
               define("LOG", node.op_type == "LogSoftmax")]
    one_per_row = flat_variant(defines, rows)
    if inner != 1 or length < ROW_GROUP_MIN or rows == 0:
        ctx.emit("reduce", "softmax", [x, out], [one_per_row], label=group.label,
                 shapes=(shape,), flops=4 * elems_of(shape))
        return
    # Long contiguous rows (attention scores): a work-group per row. One work-item per row
    # would walk its row alone, and neighbouring items would read addresses a row apart.
    variants = [Variant(tuple(defines + [define("WG", wg)]), (rows * wg,), (wg,), entry="softmax_rows")
                for wg in (64, 32)] + [one_per_row]
    ctx.emit("reduce", "softmax", [x, out], variants, label=group.label, shapes=(shape,),
             flops=4 * elems_of(shape), tune_key=f"softmax rows{rows} axis{length}")


def lower_layernorm(ctx: LoweringContext, group: NodeGroup) -> None:
    node = group.head
    attrs = node_attrs(node)
    x, scale = node.input[0], node.input[1]
    bias = node.input[2] if len(node.input) > 2 else ""
    shape = ctx.shape(x)
    axis = _axis(int(attrs.get("axis", -1)), len(shape), "LayerNormalization")
    norm_shape = shape[axis:]
    rows, norm = elems_of(shape[:axis]), elems_of(norm_shape)
    stats_shape = shape[:axis] + (1,) * (len(shape) - axis)
    outputs = list(node.output) + [""] * (3 - len(node.output))
    args = [x, scale] + ([bias] if bias else [])
    extra = []
    for name in outputs[1:3]:
        if name:
            extra.append(ctx.output(name, stats_shape))
    y = ctx.output(group.out, shape)
    defines = [define("COUNT", rows), define("NORM", norm),
               define("EPS", float(attrs.get("epsilon", 1e-5))), define("HAS_BIAS", bool(bias)),
               define("HAS_MEAN", bool(outputs[1])), define("HAS_INVSTD", bool(outputs[2])),
               ("SCALE_OFF(j)", broadcast_offset(ctx.shape(scale), norm_shape, "j")),
               ("BIAS_OFF(j)", broadcast_offset(ctx.shape(bias), norm_shape, "j") if bias else "0"),
               ("ACTIVATE(v)", "(v)")]
    ctx.emit("reduce", "layernorm", args + extra + [y], [flat_variant(defines, rows)],
             label=group.label, shapes=(shape,), flops=8 * elems_of(shape))


_REDUCERS = {
    "ReduceMean": ("0.0f", "((acc) + (v))", "((acc) / (float)R)"),
    "ReduceSum": ("0.0f", "((acc) + (v))", "(acc)"),
    "ReduceMax": ("(-INFINITY)", "fmax((acc), (v))", "(acc)"),
    "ReduceMin": ("INFINITY", "fmin((acc), (v))", "(acc)"),
}


def _reduce_axes(ctx: LoweringContext, node: "onnx.NodeProto", rank: int) -> list[int] | None:
    """Normalised axes; None means 'reduce nothing' (noop_with_empty_axes)."""
    attrs = node_attrs(node)
    if "axes" in attrs:
        axes = [int(a) for a in attrs["axes"]]
    else:
        value = ctx.optional_value(node, 1, f"{node.op_type} axes")
        axes = int_list(value) if value is not None else []
    if not axes:
        return None if attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    return sorted({_axis(a, rank, node.op_type) for a in axes})


def lower_reduce(ctx: LoweringContext, group: NodeGroup) -> None:
    node = group.head
    x = node.input[0]
    shape = ctx.shape(x)
    axes = _reduce_axes(ctx, node, len(shape))
    if axes is None:
        ctx.view(group.out, x, shape)
        if group.activations:
            raise NotLowerableError("an activation fused behind a no-op reduction")
        return
    keep = bool(node_attrs(node).get("keepdims", 1))
    kept = [d for d in range(len(shape)) if d not in axes]
    out_shape = tuple(1 if d in axes else shape[d] for d in range(len(shape))) if keep \
        else tuple(shape[d] for d in kept)
    out = ctx.output(group.out, out_shape)
    st = strides(shape)
    count = elems_of(tuple(shape[d] for d in kept))
    red = elems_of(tuple(shape[d] for d in axes))
    # An empty reduction (R = 0) stores FINAL(INIT): 0 for sums, -inf/inf for max/min.
    init, combine, final = _REDUCERS[node.op_type]
    defines = [define("COUNT", count), define("R", red),
               ("OUT_BASE(i)", offset_expr(tuple(shape[d] for d in kept), tuple(st[d] for d in kept), "i")),
               ("RED_OFF(r)", offset_expr(tuple(shape[d] for d in axes), tuple(st[d] for d in axes), "r")),
               ("INIT", init), ("COMBINE(acc, v)", combine), ("FINAL(acc)", final), *group.activate(ctx)]
    ctx.emit("reduce", "reduce", [x, out], [flat_variant(defines, count)], label=group.label,
             shapes=(shape,), flops=elems_of(shape))


LOWERINGS = {"Softmax": lower_softmax, "LogSoftmax": lower_softmax,
             "LayerNormalization": lower_layernorm}
LOWERINGS.update({op: lower_reduce for op in _REDUCERS})
