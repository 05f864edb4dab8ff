"""MaxPool, AveragePool (1-D/2-D) and the global pools."""

from __future__ import annotations

from backends.opencl.attrs import node_attrs
from backends.opencl.lowering import NodeGroup
from backends.opencl.lowering.context import LoweringContext, NotLowerableError, define, flat_variant
from backends.opencl.lowering.spatial import window
from backends.opencl.plan import elems_of


def lower_pool(ctx: LoweringContext, group: NodeGroup) -> None:
    node = group.head
    attrs = node_attrs(node)
    x = node.input[0]
    shape = ctx.shape(x)
    if len(shape) not in (3, 4):
        raise NotLowerableError(f"{node.op_type} of rank {len(shape)} (1-D/2-D pooling only)")
    kernel = tuple(int(k) for k in attrs["kernel_shape"])
    win = window(attrs, shape[2:], kernel, ceil_mode=bool(attrs.get("ceil_mode", 0)))
    out_shape = shape[:2] + win.out
    out = ctx.output(group.out, out_shape)
    w2 = win.as_2d()
    ih, iw = (1,) * (4 - len(shape)) + shape[2:]
    count = elems_of(out_shape)
    defines = [define("COUNT", count), define("IH", ih), define("IW", iw), define("OH", w2.out[0]),
               define("OW", w2.out[1]), define("KH", w2.kernel[0]), define("KW", w2.kernel[1]),
               define("SH", w2.strides[0]), define("SW", w2.strides[1]), define("DH", w2.dilations[0]),
               define("DW", w2.dilations[1]), define("PT", w2.pads_begin[0]), define("PL", w2.pads_begin[1]),
               define("PB", w2.pads_end[0]), define("PR", w2.pads_end[1]),
               define("IS_MAX", node.op_type == "MaxPool"),
               define("COUNT_PAD", bool(attrs.get("count_include_pad", 0))), *group.activate(ctx)]
    ctx.emit("pool", "pool", [x, out], [flat_variant(defines, count)], label=group.label,
             shapes=(shape,), flops=count * elems_of(kernel))


def lower_global_pool(ctx: LoweringContext, group: NodeGroup) -> None:
    x = group.head.input[0]
    shape = ctx.shape(x)
    if len(shape) < 3:
        raise NotLowerableError(f"{group.head.op_type} needs rank >= 3, got {shape}")
    out_shape = shape[:2] + (1,) * (len(shape) - 2)
    out = ctx.output(group.out, out_shape)
    count = shape[0] * shape[1]
    defines = [define("COUNT", count), define("SPATIAL", elems_of(shape[2:])),
               define("IS_MAX", group.head.op_type == "GlobalMaxPool"), *group.activate(ctx)]
    ctx.emit("pool", "global_pool", [x, out], [flat_variant(defines, count)], label=group.label,
             shapes=(shape,), flops=elems_of(shape))


LOWERINGS = {"MaxPool": lower_pool, "AveragePool": lower_pool,
             "GlobalAveragePool": lower_global_pool, "GlobalMaxPool": lower_global_pool}
