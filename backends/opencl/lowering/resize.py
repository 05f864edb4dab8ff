"""Resize (nearest, linear) with host-known scales or sizes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from backends.opencl.attrs import node_attrs
from backends.opencl.lowering import NodeGroup
from backends.opencl.lowering.context import LoweringContext, NotLowerableError, define, flat_variant
from backends.opencl.plan import elems_of

if TYPE_CHECKING:
    import onnx

_COORD_MODES = {"half_pixel": 0, "asymmetric": 1, "align_corners": 2, "pytorch_half_pixel": 3,
                "half_pixel_symmetric": 4}
_NEAREST_MODES = {"round_prefer_floor": 0, "round_prefer_ceil": 1, "floor": 2, "ceil": 3}


def _present(ctx: LoweringContext, node: "onnx.NodeProto", slot: int, what: str) -> np.ndarray | None:
    value = ctx.optional_value(node, slot, what)
    return value if value is not None and value.size else None


def resize_geometry(ctx: LoweringContext, node: "onnx.NodeProto", shape: tuple[int, ...]
                    ) -> tuple[list[float], list[int]]:
    """Per-dim scales (output/input, as the coordinate maps use them) and output sizes."""
    attrs = node_attrs(node)
    rank = len(shape)
    if ctx.opset < 11:
        scales_in, sizes_in = _present(ctx, node, 1, "Resize scales"), None
    else:
        scales_in = _present(ctx, node, 2, "Resize scales")
        sizes_in = _present(ctx, node, 3, "Resize sizes")
    axes = [int(a) % rank for a in attrs.get("axes", range(rank))]
    if scales_in is not None:
        scales = [1.0] * rank
        for axis, s in zip(axes, scales_in.astype(np.float32).reshape(-1)):
            scales[axis] = float(s)
        sizes = [int(np.floor(np.float64(np.float32(s)) * n)) for s, n in zip(scales, shape)]
        return scales, sizes
    if sizes_in is None:
        raise NotLowerableError("Resize needs scales or sizes")
    target = list(shape)
    for axis, size in zip(axes, sizes_in.reshape(-1)):
        target[axis] = int(size)
    scales = [t / n for t, n in zip(target, shape)]
    policy = attrs.get("keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
        pick = min if policy == "not_larger" else max
        scale = pick(scales[a] for a in axes)
        scales = [scale if d in axes else 1.0 for d in range(rank)]
        target = [int(scale * n + 0.5) if d in axes else n for d, n in enumerate(shape)]
    return scales, target


def lower_resize(ctx: LoweringContext, group: NodeGroup) -> None:
    node = group.head
    attrs = node_attrs(node)
    x = node.input[0]
    shape = ctx.shape(x)
    if len(shape) > 4:
        raise NotLowerableError(f"Resize of rank {len(shape)} (rank <= 4 only)")
    scales, sizes = resize_geometry(ctx, node, shape)
    mode = attrs.get("mode", "nearest")
    lead = 4 - len(shape)
    in4 = (1,) * lead + tuple(shape)
    out4 = (1,) * lead + tuple(sizes)
    scale4 = [1.0] * lead + scales
    if mode == "linear" and in4[:2] != out4[:2]:
        raise NotLowerableError("linear Resize of dimensions other than the last two")
    out = ctx.output(group.out, tuple(sizes))
    count = elems_of(tuple(sizes))
    defines = [define("COUNT", count), *group.activate(ctx),
               define("COORD_MODE", _COORD_MODES[attrs.get("coordinate_transformation_mode", "half_pixel")]),
               define("NEAREST_MODE", _NEAREST_MODES[attrs.get("nearest_mode", "round_prefer_floor")])]
    for d in range(4):
        defines += [define(f"I{d}", in4[d]), define(f"O{d}", out4[d]), define(f"S{d}", float(scale4[d]))]
    entry = "resize_linear" if mode == "linear" else "resize_nearest"
    ctx.emit("resize", entry, [x, out], [flat_variant(defines, count)], label=group.label,
             shapes=(shape,), flops=count * (8 if mode == "linear" else 1))


LOWERINGS = {"Resize": lower_resize}
