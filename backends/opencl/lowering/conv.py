"""Conv (direct, register-blocked; 1x1 via GEMM) and ConvTranspose.

A BatchNormalization grouped behind a Conv is folded into its weights and
bias here, on the host, once per specialisation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.opencl.attrs import node_attrs
from backends.opencl.lowering import NodeGroup
from backends.opencl.lowering.context import LoweringContext, NotLowerableError, ceil_div, define, flat_variant
from backends.opencl.lowering.linear import GemmShape, emit_gemm
from backends.opencl.lowering.spatial import Window, window
from backends.opencl.plan import Variant, elems_of


def _folded_batchnorm(ctx: LoweringContext, group: NodeGroup, w: str, b: str) -> tuple[str, str]:
    """Weights and bias with the grouped BatchNormalization folded in."""
    bn = group.batchnorm
    assert bn is not None
    eps = float(node_attrs(bn).get("epsilon", 1e-5))
    gamma, beta, mean, var = (ctx.value(name, "BatchNormalization parameter").astype(np.float64)
                              for name in bn.input[1:5])
    weights = ctx.value(w, "Conv weights").astype(np.float64)
    bias = ctx.value(b, "Conv bias").astype(np.float64) if b else np.zeros(weights.shape[0])
    scale = gamma / np.sqrt(var + eps)
    folded_w = weights * scale.reshape((-1,) + (1,) * (weights.ndim - 1))
    folded_b = (bias - mean) * scale + beta
    return ctx.constant(w, folded_w), ctx.constant(f"{w}.bias", folded_b)


def _conv_candidates(cout_g: int, depthwise: bool, ow: int, stride_w: int) -> list[tuple[int, int]]:
    """(TCO, TP) tiles to try, the heuristic default first.

    8 channels x 8 columns measured best on PoCL/AVX2 as a default; 16-wide
    rows halve the loads per multiply-add where the tuner finds that pays.
    Stride 2 loads 2*TP inputs, so TP stays <= 8 there.
    """
    wide = 16 if ow >= 16 and stride_w == 1 else 8 if ow >= 8 else 4
    if depthwise or cout_g < 4:
        tco = 1 if depthwise else min(cout_g, 2)
        return [(tco, wide), (tco, 4)] if wide > 4 else [(tco, 4)]
    if wide == 16:
        return [(8, 8), (4, 16), (6, 16)] if cout_g >= 8 else [(4, 16), (4, 8)]
    return [(8, wide), (4, wide)] if cout_g >= 8 else [(4, wide)]


def _padded_input(ctx: LoweringContext, group: NodeGroup, x: str, w2: Window, tp_max: int) -> tuple[str, int, int]:
    """``x`` zero-padded so every tile's reads are in bounds: (tensor, height, width).

    One copy pass buys branch-free vector loads in the convolution's inner loop.
    """
    from backends.opencl.lowering.layout import emit_pad

    shape = ctx.shape(x)
    ih, iw = (1,) * (4 - len(shape)) + shape[2:]
    oh, ow = w2.out
    tiles = ceil_div(ow, tp_max)
    need_w = (tiles * tp_max - 1) * w2.strides[1] + (w2.kernel[1] - 1) * w2.dilations[1] + 1
    need_w += 1 if w2.strides[1] == 2 else 0  # the even-lane load reads one past the last tap
    need_h = (oh - 1) * w2.strides[0] + (w2.kernel[0] - 1) * w2.dilations[0] + 1
    top, left = w2.pads_begin
    bottom = max(0, need_h - top - ih)
    right = max(0, need_w - left - iw)
    if not (top or left or bottom or right):
        return x, ih, iw
    spatial = len(shape) - 2
    begin = [0, 0] + ([top] if spatial == 2 else []) + [left]
    end = [0, 0] + ([bottom] if spatial == 2 else []) + [right]
    padded = emit_pad(ctx, group.label, x, f"{x}#padded{len(ctx.program.steps)}", begin, end)
    return padded, top + ih + bottom, left + iw + right


def lower_conv(ctx: LoweringContext, group: NodeGroup) -> None:
    node = group.head
    attrs = node_attrs(node)
    x, w = node.input[0], node.input[1]
    b = node.input[2] if len(node.input) > 2 else ""
    x_shape, w_shape = ctx.shape(x), ctx.shape(w)
    if len(x_shape) not in (3, 4) or len(w_shape) != len(x_shape):
        raise NotLowerableError(f"Conv of input {x_shape} with weights {w_shape} (1-D/2-D only)")
    groups = int(attrs.get("group", 1))
    n, cin = x_shape[:2]
    cout, cin_g = w_shape[:2]
    if cin != cin_g * groups or cout % groups:
        raise NotLowerableError(f"Conv channels: input {cin}, weights {w_shape}, group {groups}")
    kernel = tuple(int(k) for k in attrs.get("kernel_shape", w_shape[2:]))
    win = window(attrs, x_shape[2:], kernel)
    if group.batchnorm is not None:
        w, b = _folded_batchnorm(ctx, group, w, b)
    out_shape = (n, cout) + win.out
    residual, residual_defines = group.residual_args(ctx, out_shape)
    out = ctx.output(group.out, out_shape)
    w2 = win.as_2d()
    ih, iw = (1,) * (4 - len(x_shape)) + x_shape[2:]
    oh, ow = w2.out
    flops = 2 * elems_of(out_shape) * cin_g * elems_of(kernel)
    shapes = (x_shape, w_shape)
    pointwise = (elems_of(kernel) == 1 and groups == 1 and set(win.strides) == {1}
                 and not any(win.pads_begin) and not any(win.pads_end))
    if pointwise:  # Y[n] = W[cout, cin] @ X[n][cin, h*w]: a batched GEMM
        hw = oh * ow
        g = GemmShape(m=cout, n=hw, k=cin, batch=n, sam=cin, sak=1, b_off=f"((b) * {cin * hw})",
                      sbk=hw, sbn=1, y_off=f"((b) * {cout * hw})", has_c=bool(b), scm=1, scn=0,
                      has_res=bool(residual))
        emit_gemm(ctx, g, [w, x] + ([b] if b else []) + residual + [out], group.activate(ctx),
                  label=group.label, shapes=shapes)
        return
    cout_g = cout // groups
    candidates = _conv_candidates(cout_g, cin_g == 1 and cout_g == 1, ow, w2.strides[1])
    padded = cin_g > 1 and w2.strides[1] in (1, 2)
    pad_top, pad_left = w2.pads_begin
    if padded:
        x, ih, iw = _padded_input(ctx, group, x, w2, max(tp for _, tp in candidates))
        pad_top = pad_left = 0
    base = [define("CIN", cin), define("IH", ih), define("IW", iw), define("COUT", cout),
            define("OH", oh), define("OW", ow), define("KH", w2.kernel[0]), define("KW", w2.kernel[1]),
            define("SH", w2.strides[0]), define("SW", w2.strides[1]), define("DH", w2.dilations[0]),
            define("DW", w2.dilations[1]), define("PT", pad_top), define("PL", pad_left),
            define("GROUPS", groups), define("CIN_G", cin_g), define("COUT_G", cout_g), define("PADDED", padded),
            define("HAS_BIAS", bool(b)), *residual_defines, *group.activate(ctx)]
    variants = []
    if cin_g == 1:  # depthwise: a row per work-item first (see conv.cl)
        extent_w = (w2.kernel[1] - 1) * w2.dilations[1] + 1
        lo = ceil_div(w2.pads_begin[1], w2.strides[1])
        hi = min(ow, (iw - extent_w + w2.pads_begin[1]) // w2.strides[1] + 1)
        rows = base + [define("NB", n), define("LO", lo), define("HI", max(hi, lo))]
        variants.append(Variant(tuple(rows), (oh, n * cout), None, entry="depthwise_rows"))
    for tco, tp in candidates:
        tiles = ceil_div(cout_g, tco)
        defines = base + [define("TCO", tco), define("TP", tp), define("CO_TILES", tiles)]
        variants.append(Variant(tuple(defines), (ceil_div(ow, tp), oh, n * groups * tiles), None))
    key = f"conv x{x_shape} w{w_shape} g{groups} s{win.strides} d{win.dilations} p{win.pads_begin}"
    ctx.emit("conv", "conv2d", [x, w] + ([b] if b else []) + residual + [out], variants, label=group.label,
             shapes=shapes, flops=flops, tune_key=key)


def _transpose_geometry(attrs: dict[str, Any], x_shape: tuple[int, ...], kernel: tuple[int, ...]
                        ) -> tuple[list[int], list[int], list[int], list[int]]:
    """(strides, dilations, leading pads, output sizes) per ONNX ConvTranspose."""
    rank = len(kernel)
    spatial = x_shape[2:]
    strides = [int(s) for s in attrs.get("strides", [1] * rank)]
    dilations = [int(d) for d in attrs.get("dilations", [1] * rank)]
    out_pad = [int(p) for p in attrs.get("output_padding", [0] * rank)]
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    full = [s * (n - 1) + op + e for s, n, op, e in zip(strides, spatial, out_pad, extent)]
    auto_pad = attrs.get("auto_pad", "NOTSET")
    output_shape = [int(v) for v in attrs.get("output_shape", [])][-rank:] if "output_shape" in attrs else None
    if "pads" in attrs and auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        pads = [int(p) for p in attrs["pads"]]
        begin = pads[:rank]
        out = output_shape or [f - pads[d] - pads[d + rank] for d, f in enumerate(full)]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = output_shape or [n * s for n, s in zip(spatial, strides)]
        total = [f - o for f, o in zip(full, out)]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
    else:
        begin = [0] * rank
        out = output_shape or full
    return strides, dilations, begin, out


def lower_conv_transpose(ctx: LoweringContext, group: NodeGroup) -> None:
    node = group.head
    attrs = node_attrs(node)
    x, w = node.input[0], node.input[1]
    b = node.input[2] if len(node.input) > 2 else ""
    x_shape, w_shape = ctx.shape(x), ctx.shape(w)
    if len(x_shape) not in (3, 4) or len(w_shape) != len(x_shape):
        raise NotLowerableError(f"ConvTranspose of input {x_shape} with weights {w_shape}")
    groups = int(attrs.get("group", 1))
    n, cin = x_shape[:2]
    cout_g = w_shape[1]
    cout = cout_g * groups
    kernel = tuple(int(k) for k in attrs.get("kernel_shape", w_shape[2:]))
    strides, dilations, begin, out_sizes = _transpose_geometry(attrs, x_shape, kernel)
    out_shape = (n, cout) + tuple(out_sizes)
    out = ctx.output(group.out, out_shape)
    pad1 = lambda values, fill: ([fill] * (2 - len(values))) + list(values)  # noqa: E731
    kh, kw = pad1(kernel, 1)
    sh, sw = pad1(strides, 1)
    dh, dw = pad1(dilations, 1)
    pt, pl = pad1(begin, 0)
    ih, iw = pad1(list(x_shape[2:]), 1)
    oh, ow = pad1(out_sizes, 1)
    count = elems_of(out_shape)
    defines = [define("COUNT", count), define("CIN", cin), define("IH", ih), define("IW", iw),
               define("COUT", cout), define("OH", oh), define("OW", ow), define("KH", kh),
               define("KW", kw), define("SH", sh), define("SW", sw), define("DH", dh), define("DW", dw),
               define("PT", pt), define("PL", pl), define("CIN_G", cin // groups),
               define("COUT_G", cout_g), define("HAS_BIAS", bool(b)), *group.activate(ctx)]
    ctx.emit("conv", "conv_transpose", [x, w] + ([b] if b else []) + [out],
             [flat_variant(defines, count)], label=group.label, shapes=(x_shape, w_shape),
             flops=2 * elems_of(x_shape) * cout_g * elems_of(kernel))


LOWERINGS = {"Conv": lower_conv, "ConvTranspose": lower_conv_transpose}
