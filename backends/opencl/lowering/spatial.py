"""Output sizes and paddings of sliding-window ops (Conv, pools), per ONNX."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from backends.opencl.lowering.context import NotLowerableError


@dataclass(frozen=True)
class Window:
    """Per spatial dim: kernel, stride, dilation, leading/trailing pad, output size."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    out: tuple[int, ...]

    def as_2d(self) -> "Window":
        """1-D windows as 2-D with a unit leading dim (the kernels are 2-D)."""
        if len(self.kernel) == 2:
            return self
        return Window((1, *self.kernel), (1, *self.strides), (1, *self.dilations),
                      (0, *self.pads_begin), (0, *self.pads_end), (1, *self.out))


def window(attrs: dict[str, Any], spatial: tuple[int, ...], kernel: tuple[int, ...], *,
           ceil_mode: bool = False) -> Window:
    """Resolve strides/dilations/pads/auto_pad for input sizes ``spatial``."""
    rank = len(spatial)
    strides = tuple(int(s) for s in attrs.get("strides", [1] * rank))
    dilations = tuple(int(d) for d in attrs.get("dilations", [1] * rank))
    auto_pad = attrs.get("auto_pad", "NOTSET")
    extent = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = tuple(math.ceil(n / s) for n, s in zip(spatial, strides))
        total = [max(0, (o - 1) * s + e - n) for o, s, e, n in zip(out, strides, extent, spatial)]
        small = [t // 2 for t in total]
        large = [t - t // 2 for t in total]
        begin, end = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
        return Window(kernel, strides, dilations, tuple(begin), tuple(end), out)
    if auto_pad == "VALID":
        pads = [0] * (2 * rank)
    else:
        pads = [int(p) for p in attrs.get("pads", [0] * (2 * rank))]
    begin, end = tuple(pads[:rank]), tuple(pads[rank:])
    out = []
    for d in range(rank):
        span = spatial[d] + begin[d] + end[d] - extent[d]
        size = (math.ceil(span / strides[d]) if ceil_mode else span // strides[d]) + 1
        if ceil_mode and (size - 1) * strides[d] >= spatial[d] + begin[d]:
            size -= 1  # the last window must start inside the input or its leading pad
        out.append(size)
    if any(o <= 0 for o in out):
        raise NotLowerableError(f"window {kernel} over {spatial} gives an empty output {tuple(out)}")
    return Window(kernel, strides, dilations, begin, end, tuple(out))
