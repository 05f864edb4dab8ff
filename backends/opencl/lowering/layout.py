"""Views (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout: no copy) and
data movement (Transpose, Concat, Slice, Split, Pad) on the gather-copy kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from backends.opencl.attrs import node_attrs
from backends.opencl.lowering import NodeGroup
from backends.opencl.lowering.context import LoweringContext, NotLowerableError, define, flat_variant, int_list
from backends.opencl.lowering.index import collapse, offset_expr, strides
from backends.opencl.plan import elems_of, render_float

if TYPE_CHECKING:
    import onnx


def _axes(ctx: LoweringContext, node: "onnx.NodeProto", slot: int, rank: int) -> list[int]:
    attrs = node_attrs(node)
    if "axes" in attrs:
        raw = [int(a) for a in attrs["axes"]]
    else:
        value = ctx.optional_value(node, slot, f"{node.op_type} axes")
        raw = int_list(value) if value is not None else []
    return [a % rank if rank else 0 for a in raw]


def lower_view(ctx: LoweringContext, group: NodeGroup) -> None:
    node = group.head
    x = node.input[0]
    shape = ctx.shape(x)
    op = node.op_type
    attrs = node_attrs(node)
    if op == "Reshape":
        target = int_list(ctx.value(node.input[1], "Reshape shape"))
        allow_zero = bool(attrs.get("allowzero", 0))
        dims = [shape[i] if d == 0 and not allow_zero else d for i, d in enumerate(target)]
        if -1 in dims:
            known = elems_of(tuple(d for d in dims if d != -1))
            dims[dims.index(-1)] = elems_of(shape) // known if known else 0
        new_shape = tuple(dims)
    elif op == "Flatten":
        axis = int(attrs.get("axis", 1))
        axis = axis + len(shape) if axis < 0 else axis
        new_shape = (elems_of(shape[:axis]), elems_of(shape[axis:]))
    elif op == "Squeeze":
        axes = _axes(ctx, node, 1, len(shape)) or [d for d, s in enumerate(shape) if s == 1]
        new_shape = tuple(s for d, s in enumerate(shape) if d not in axes)
    elif op == "Unsqueeze":
        axes_raw = node_attrs(node).get("axes")
        raw = [int(a) for a in axes_raw] if axes_raw is not None else int_list(
            ctx.value(node.input[1], "Unsqueeze axes"))
        rank = len(shape) + len(raw)
        axes = sorted(a % rank for a in raw)
        dims = list(shape)
        for a in axes:
            dims.insert(a, 1)
        new_shape = tuple(dims)
    elif op == "Dropout":
        training = ctx.optional_value(node, 2, "Dropout training_mode")
        if training is not None and bool(np.asarray(training).reshape(-1)[0]):
            raise NotLowerableError("Dropout in training mode is random")
        if len(node.output) > 1 and node.output[1]:
            ctx.values[node.output[1]] = np.ones(shape, dtype=bool)
        new_shape = shape
    else:  # Identity, float-to-float Cast
        new_shape = shape
    ctx.view(group.out, x, new_shape)


def _emit_copy(ctx: LoweringContext, label: str, src: str, dst: str, count: int, src_off: str,
               dst_off: str = "(i)", valid: str | None = None, pad_value: float = 0.0,
               shapes: tuple[tuple[int, ...], ...] = ()) -> None:
    if count == 0:
        return
    defines = [define("COUNT", count), ("SRC_OFF(i)", src_off), ("DST_OFF(i)", dst_off)]
    if valid is not None:
        defines += [("VALID(i)", valid), ("PAD_VALUE", render_float(pad_value))]
    ctx.emit("layout", "copy", [src, dst], [flat_variant(defines, count)], label=label,
             shapes=shapes, flops=0)


def lower_transpose(ctx: LoweringContext, group: NodeGroup) -> None:
    x = group.head.input[0]
    shape = ctx.shape(x)
    perm = node_attrs(group.head).get("perm") or list(reversed(range(len(shape))))
    out_shape = tuple(shape[p] for p in perm)
    out = ctx.output(group.out, out_shape)
    st = strides(shape)
    dims, (coeffs,) = collapse(out_shape, [tuple(st[p] for p in perm)])
    _emit_copy(ctx, group.label, x, out, elems_of(out_shape), offset_expr(dims, coeffs), shapes=(shape,))


def lower_concat(ctx: LoweringContext, group: NodeGroup) -> None:
    node = group.head
    inputs = [n for n in node.input if n]
    shapes = [ctx.shape(n) for n in inputs]
    rank = len(shapes[0])
    axis = int(node_attrs(node)["axis"]) % rank
    out_shape = list(shapes[0])
    out_shape[axis] = sum(s[axis] for s in shapes)
    out = ctx.output(group.out, tuple(out_shape))
    out_st = strides(tuple(out_shape))
    offset = 0
    for name, shape in zip(inputs, shapes):
        dims, (coeffs,) = collapse(shape, [out_st])
        dst = offset_expr(dims, coeffs)
        _emit_copy(ctx, group.label, name, out, elems_of(shape), "(i)",
                   f"({dst} + {offset * out_st[axis]})", shapes=(shape,))
        offset += shape[axis]


def _emit_slice(ctx: LoweringContext, label: str, x: str, out_name: str, shape: tuple[int, ...],
                starts: list[int], steps: list[int], out_shape: tuple[int, ...]) -> None:
    out = ctx.output(out_name, out_shape)
    st = strides(shape)
    base = sum(s * t for s, t in zip(starts, st))
    dims, (coeffs,) = collapse(out_shape, [tuple(step * t for step, t in zip(steps, st))])
    _emit_copy(ctx, label, x, out, elems_of(out_shape), f"({offset_expr(dims, coeffs)} + {base})",
               shapes=(shape,))


def lower_slice(ctx: LoweringContext, group: NodeGroup) -> None:
    node = group.head
    x = node.input[0]
    shape = ctx.shape(x)
    attrs = node_attrs(node)
    if ctx.opset < 10:
        starts, ends = attrs["starts"], attrs["ends"]
        axes = attrs.get("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = int_list(ctx.value(node.input[1], "Slice starts"))
        ends = int_list(ctx.value(node.input[2], "Slice ends"))
        axes_value = ctx.optional_value(node, 3, "Slice axes")
        axes = int_list(axes_value) if axes_value is not None else list(range(len(starts)))
        steps_value = ctx.optional_value(node, 4, "Slice steps")
        steps = int_list(steps_value) if steps_value is not None else [1] * len(starts)
    first, step_of, out_shape = [0] * len(shape), [1] * len(shape), list(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis %= len(shape)
        begin, stop, stride = slice(int(start), int(end), int(step)).indices(shape[axis])
        first[axis], step_of[axis] = begin, stride
        out_shape[axis] = len(range(begin, stop, stride))
    _emit_slice(ctx, group.label, x, group.out, shape, first, step_of, tuple(out_shape))


def lower_split(ctx: LoweringContext, group: NodeGroup) -> None:
    node = group.head
    x = node.input[0]
    shape = ctx.shape(x)
    attrs = node_attrs(node)
    axis = int(attrs.get("axis", 0)) % len(shape)
    outputs = list(node.output)
    if "split" in attrs:
        sizes = [int(s) for s in attrs["split"]]
    elif len(node.input) > 1 and node.input[1]:
        sizes = int_list(ctx.value(node.input[1], "Split sizes"))
    else:
        parts = int(attrs.get("num_outputs", len(outputs)))
        chunk = -(-shape[axis] // parts)
        sizes = [min(chunk, shape[axis] - chunk * i) for i in range(parts)]
    offset = 0
    for name, size in zip(outputs, sizes):
        starts = [0] * len(shape)
        starts[axis] = offset
        out_shape = tuple(size if d == axis else s for d, s in enumerate(shape))
        if name:
            _emit_slice(ctx, group.label, x, name, shape, starts, [1] * len(shape), out_shape)
        offset += size


def _pad_source(dim: str, size: int, mode: str) -> str:
    """Source coordinate for an output coordinate shifted by its leading pad."""
    if mode == "edge":
        return f"clamp({dim}, 0, {size - 1})"
    if mode == "wrap":
        return f"((({dim}) % {size} + {size}) % {size})"
    if size == 1:
        return "0"
    period = 2 * (size - 1)
    m = f"((({dim}) % {period} + {period}) % {period})"
    return f"({m} < {size} ? {m} : {period} - {m})"


def lower_pad(ctx: LoweringContext, group: NodeGroup) -> None:
    node = group.head
    x = node.input[0]
    shape = ctx.shape(x)
    rank = len(shape)
    attrs = node_attrs(node)
    mode = attrs.get("mode", "constant")
    if ctx.opset < 11:
        pads, value = [int(p) for p in attrs["pads"]], float(attrs.get("value", 0.0))
    else:
        pads = int_list(ctx.value(node.input[1], "Pad pads"))
        constant = ctx.optional_value(node, 2, "Pad constant_value")
        value = float(np.asarray(constant).reshape(-1)[0]) if constant is not None and constant.size else 0.0
        axes_value = ctx.optional_value(node, 3, "Pad axes")
        if axes_value is not None:
            axes = [a % rank for a in int_list(axes_value)]
            full = [0] * (2 * rank)
            for i, a in enumerate(axes):
                full[a], full[a + rank] = pads[i], pads[i + len(axes)]
            pads = full
    emit_pad(ctx, group.label, x, group.out, pads[:rank], pads[rank:], mode, value)


def emit_pad(ctx: LoweringContext, label: str, x: str, out_name: str, begin: list[int], end: list[int],
             mode: str = "constant", value: float = 0.0) -> str:
    """Copy ``x`` into a new tensor ``out_name`` padded by ``begin``/``end`` per dim; returns its name."""
    shape = ctx.shape(x)
    out_shape = tuple(s + b + e for s, b, e in zip(shape, begin, end))
    if any(d < 0 for d in out_shape):
        raise NotLowerableError(f"padding {begin}/{end} of {shape} gives a negative size")
    out = ctx.output(out_name, out_shape)
    rank = len(shape)
    if (mode == "constant" and rank >= 2 and not any(begin[:-2]) and not any(end[:-2])
            and min(begin + end) >= 0):
        planes, rows = elems_of(shape[:-2]), elems_of(out_shape[:-2]) * out_shape[-2]
        defines = [define("PLANES", planes), define("IH", shape[-2]), define("IW", shape[-1]),
                   define("OHP", out_shape[-2]), define("OWP", out_shape[-1]), define("TOP", begin[-2]),
                   define("LEFT", begin[-1]), ("PAD_VALUE", render_float(value))]
        ctx.emit("layout", "pad2d", [x, out], [flat_variant(defines, rows)], label=label, shapes=(shape,))
        return out
    in_st, out_st = strides(shape), strides(out_shape)
    terms, checks = [], []
    for d in range(len(shape)):
        coord = f"(((i) / {out_st[d]}) % {out_shape[d]})"
        src = f"({coord} - {begin[d]})" if begin[d] else coord
        if begin[d] or end[d]:
            if mode == "constant":
                checks.append(f"({src} >= 0 && {src} < {shape[d]})")
            elif shape[d] > 0:
                src = _pad_source(src, shape[d], mode)
        terms.append(f"({src}) * {in_st[d]}")
    src_off = "(" + " + ".join(terms) + ")" if terms else "0"
    valid = "(" + " && ".join(checks) + ")" if checks else None
    _emit_copy(ctx, label, x, out, elems_of(out_shape), src_off, valid=valid, pad_value=value, shapes=(shape,))
    return out


LOWERINGS = {op: lower_view for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity",
                                       "Dropout", "Cast")}
LOWERINGS.update({"Transpose": lower_transpose, "Concat": lower_concat, "Slice": lower_slice,
                  "Split": lower_split, "Pad": lower_pad})
