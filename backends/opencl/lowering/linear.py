"""Gemm and MatMul (batched, broadcasting) on the register-tiled GEMM kernel.

Host-known B operands (weights) are packed into TN-wide panels once, so the
inner loop reads B with aligned vector loads; a MatMul whose B has no batch
dims folds A's batch dims into M, making one large GEMM.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backends.opencl.attrs import node_attrs
from backends.opencl.lowering import NodeGroup
from backends.opencl.lowering.context import LoweringContext, NotLowerableError, ceil_div, define
from backends.opencl.lowering.elementwise import lower_binary
from backends.opencl.lowering.index import broadcast_strides, collapse, offset_expr
from backends.opencl.plan import Variant, elems_of


@dataclass(frozen=True)
class GemmShape:
    """Y[b] = ALPHA * A[b] @ B[b] (+ BETA * C) for b < batch; offsets are kernel expressions."""

    m: int
    n: int
    k: int
    batch: int = 1
    a_off: str = "0"
    sam: int = 0
    sak: int = 1
    b_off: str = "0"
    sbk: int = 0
    sbn: int = 1
    y_off: str = "0"
    packed_tn: int = 0  # TN of a panel-packed B, 0 when B is strided
    c_off: str = "0"
    scm: int = 0
    scn: int = 0
    has_c: bool = False
    has_res: bool = False  # a residual tensor laid out like Y
    alpha: float = 1.0
    beta: float = 1.0


def pack_panels(b: np.ndarray, tn: int) -> np.ndarray:
    """[K, N] -> [ceil(N/tn)][K][tn], zero padded: a work-item's B columns are contiguous."""
    k, n = b.shape
    padded = np.zeros((k, ceil_div(n, tn) * tn), dtype=np.float32)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, -1, tn).transpose(1, 0, 2))


def panel_width(n: int) -> int:
    """Columns per work-item tile (and per packed B panel): the widest vector that fits."""
    return 16 if n >= 16 else 8 if n >= 8 else 4


def _tiles(m: int, n: int, width: int) -> list[tuple[int, int]]:
    """(TM, TN) candidates, the heuristic default first.

    On PoCL/AVX2, 6x16 keeps 12 accumulator vectors plus the B vector and an A
    broadcast in the 16 registers; 8x8 suits GPUs with narrower SIMD.
    """
    if m >= 8:
        return {16: [(6, 16), (4, 16), (8, 8)], 8: [(8, 8), (4, 8)], 4: [(8, 4), (4, 4)]}[width]
    if m >= 4:
        return [(4, width), (2, width)]
    return [(m, width)] + ([(m, width // 2)] if width == 16 else [])


def gemm_defines(g: GemmShape, act: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    """Instance defines of gemm.cl for ``g`` (all but the tile TM x TN)."""
    return [
        define("M", g.m), define("N", g.n), define("K", g.k), define("PW", g.packed_tn or 1),
        ("A_OFF(b)", g.a_off), define("SAM", g.sam), define("SAK", g.sak),
        ("B_OFF(b)", g.b_off), ("Y_OFF(b)", g.y_off), define("BPACK", bool(g.packed_tn)),
        define("SBK", g.sbk), define("SBN", g.sbn), define("B_VEC", g.sbn == 1 and not g.packed_tn),
        define("HAS_C", g.has_c), ("C_OFF(b)", g.c_off), define("SCM", g.scm), define("SCN", g.scn),
        define("HAS_RES", g.has_res),
        define("ALPHA", float(g.alpha)), define("BETA", float(g.beta)), *act,
    ]


def emit_gemm(ctx: LoweringContext, g: GemmShape, args: list[str], act: tuple[tuple[str, str], ...], *,
              label: str, shapes: tuple[tuple[int, ...], ...]) -> None:
    """Emit the GEMM step with its tuning candidates; ``args`` = A, B, [C], [R], Y."""
    base = gemm_defines(g, act)
    variants = []
    for tm, tn in _tiles(g.m, g.n, g.packed_tn or panel_width(g.n)):
        grid = (ceil_div(g.n, tn), ceil_div(g.m, tm), g.batch)
        variants.append(Variant(tuple(base + [define("TM", tm), define("TN", tn)]), grid, None))
    tm, tn = _tiles(g.m, g.n, g.packed_tn or panel_width(g.n))[0]
    if ceil_div(g.n, tn) >= 8 and ceil_div(g.m, tm) >= 8:  # an explicit work-group for GPUs
        grid = (ceil_div(ceil_div(g.n, tn), 8) * 8, ceil_div(ceil_div(g.m, tm), 8) * 8, g.batch)
        variants.append(Variant(tuple(base + [define("TM", tm), define("TN", tn)]), grid, (8, 8, 1)))
    key = (f"gemm M{g.m} N{g.n} K{g.k} b{g.batch} packed{g.packed_tn} sa{g.sam},{g.sak} "
           f"sb{g.sbk},{g.sbn} c{int(g.has_c)}")
    ctx.emit("gemm", "gemm", args, variants, label=label, shapes=shapes,
             flops=2 * g.m * g.n * g.k * g.batch, tune_key=key)


def lower_gemm(ctx: LoweringContext, group: NodeGroup) -> None:
    node = group.head
    attrs = node_attrs(node)
    a, b = node.input[0], node.input[1]
    a_shape, b_shape = ctx.shape(a), ctx.shape(b)
    if len(a_shape) != 2 or len(b_shape) != 2:
        raise NotLowerableError(f"Gemm needs 2-D operands, got {a_shape} and {b_shape}")
    trans_a, trans_b = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
    m, k = (a_shape[1], a_shape[0]) if trans_a else a_shape
    n = b_shape[0] if trans_b else b_shape[1]
    if (b_shape[1] if trans_b else b_shape[0]) != k:
        raise NotLowerableError(f"Gemm inner dims differ: A {a_shape} B {b_shape}")
    out = ctx.output(group.out, (m, n))
    spec = dict(m=m, n=n, k=k, sam=1 if trans_a else k, sak=m if trans_a else 1,
                alpha=float(attrs.get("alpha", 1.0)), beta=float(attrs.get("beta", 1.0)))
    if ctx.has_value(b):
        matrix = ctx.value(b, "Gemm B").astype(np.float32)
        tn = panel_width(n)
        b = ctx.constant(b, pack_panels(matrix.T if trans_b else matrix, tn))
        spec.update(packed_tn=tn)
    else:
        spec.update(sbk=1 if trans_b else n, sbn=k if trans_b else 1)
    args = [a, b]
    c = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    if c and spec["beta"] != 0.0:
        scm, scn = broadcast_strides(ctx.shape(c), (m, n))
        spec.update(has_c=True, scm=scm, scn=scn)
        args.append(c)
    residual, _ = group.residual_args(ctx, (m, n))
    spec.update(has_res=bool(residual))
    emit_gemm(ctx, GemmShape(**spec), args + residual + [out], group.activate(ctx), label=group.label,
              shapes=(a_shape, b_shape))


def _bias_fits(ctx: LoweringContext, bias: str, out_shape: tuple[int, ...]) -> bool:
    shape = ctx.shape(bias)
    if len(shape) > len(out_shape) or elems_of(shape[:-1]) != 1:
        return False
    return not shape or shape[-1] in (1, out_shape[-1])


def lower_matmul(ctx: LoweringContext, group: NodeGroup) -> None:
    node = group.head
    a, b = node.input[0], node.input[1]
    a_shape, b_shape = ctx.shape(a), ctx.shape(b)
    a2 = (1,) + a_shape if len(a_shape) == 1 else a_shape
    b2 = b_shape + (1,) if len(b_shape) == 1 else b_shape
    m, k = a2[-2:]
    k2, n = b2[-2:]
    if k != k2:
        raise NotLowerableError(f"MatMul inner dims differ: {a_shape} x {b_shape}")
    try:
        batch_shape = tuple(int(d) for d in np.broadcast_shapes(a2[:-2], b2[:-2]))
    except ValueError as exc:
        raise NotLowerableError(f"MatMul batch dims do not broadcast: {a_shape} x {b_shape}") from exc
    out_shape = batch_shape + ((m,) if len(a_shape) > 1 else ()) + ((n,) if len(b_shape) > 1 else ())
    bias = None
    if group.bias_add is not None:
        candidate = [x for x in group.bias_add.input if x != node.output[0]][0]
        if _bias_fits(ctx, candidate, out_shape):
            bias = candidate
        else:  # the Add broadcasts in a way the epilogue cannot: run it on its own
            lower_matmul(ctx, group.without_bias())
            if group.residual is None:
                lower_binary(ctx, NodeGroup(group.bias_add, None, None, group.activations, group.label))
            else:
                lower_binary(ctx, NodeGroup(group.bias_add, None, None, (), group.label))
                lower_binary(ctx, NodeGroup(group.residual, None, None, group.activations, group.label))
            return
    out = ctx.output(group.out, out_shape)
    spec: dict[str, object] = dict(k=k, n=n, sam=k, sak=1)
    b_batched = len(b2) > 2 and elems_of(b2[:-2]) > 1
    if not b_batched:
        # B is one matrix: every batch row of A is just more rows of M.
        spec.update(m=elems_of(a2[:-1]), batch=1)
    else:
        shape, (sa, sb, sy) = collapse(batch_shape, [
            tuple(s * m * k for s in broadcast_strides(a2[:-2], batch_shape)),
            tuple(s * k * n for s in broadcast_strides(b2[:-2], batch_shape)),
            tuple(s * m * n for s in broadcast_strides(batch_shape, batch_shape))])
        spec.update(m=m, batch=elems_of(batch_shape), a_off=offset_expr(shape, sa, "b"),
                    b_off=offset_expr(shape, sb, "b"), y_off=offset_expr(shape, sy, "b"))
    if not b_batched and ctx.has_value(b):
        tn = panel_width(n)
        b = ctx.constant(b, pack_panels(ctx.value(b, "MatMul B").reshape(k, n).astype(np.float32), tn))
        spec.update(packed_tn=tn)
    else:
        spec.update(sbk=n, sbn=1)
    args = [a, b]
    if bias is not None:
        bias_shape = ctx.shape(bias)
        spec.update(has_c=True, scn=1 if bias_shape and bias_shape[-1] == n and n > 1 else 0)
        args.append(bias)
    residual, _ = group.residual_args(ctx, out_shape)
    spec.update(has_res=bool(residual))
    args += residual
    emit_gemm(ctx, GemmShape(**spec), args + [out], group.activate(ctx), label=group.label,
              shapes=(a_shape, b_shape))


LOWERINGS = {"Gemm": lower_gemm, "MatMul": lower_matmul}
