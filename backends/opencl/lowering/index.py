"""Index arithmetic written into kernels as expressions of a linear index.

Shapes are specialised, so every stride and size is a literal and the
compiler turns divisions by constants into multiplies.
"""

from __future__ import annotations

import math


def strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major element strides."""
    out, step = [], 1
    for dim in reversed(shape):
        out.append(step)
        step *= dim
    return tuple(reversed(out))


def broadcast_strides(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of ``in_shape`` seen through numpy broadcasting to ``out_shape`` (0 = repeated)."""
    rank = len(out_shape)
    padded = (1,) * (rank - len(in_shape)) + tuple(in_shape)
    base = strides(padded)
    return tuple(0 if padded[d] == 1 and out_shape[d] != 1 else base[d] for d in range(rank))


def collapse(out_shape: tuple[int, ...], stride_sets: list[tuple[int, ...]]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Merge neighbouring dims that every stride set walks contiguously; drop size-1 dims."""
    dims = [d for d in range(len(out_shape)) if out_shape[d] != 1]
    shape: list[int] = []
    sets: list[list[int]] = [[] for _ in stride_sets]
    for d in dims:
        size = out_shape[d]
        if shape and all(s[d] * size == sets[k][-1] for k, s in enumerate(stride_sets)):
            shape[-1] *= size
            for k, s in enumerate(stride_sets):
                sets[k][-1] = s[d]
            continue
        shape.append(size)
        for k, s in enumerate(stride_sets):
            sets[k].append(s[d])
    return tuple(shape), [tuple(s) for s in sets]


def offset_expr(shape: tuple[int, ...], coeffs: tuple[int, ...], var: str = "i") -> str:
    """``sum_d coord_d(var) * coeffs[d]`` where coord_d decomposes ``var`` over ``shape``."""
    if not shape:
        return "0"
    inner = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    terms = []
    for d, (size, coeff) in enumerate(zip(shape, coeffs)):
        if coeff == 0:
            continue
        coord = f"({var})" if inner[d] == 1 else f"(({var}) / {inner[d]})"
        if d > 0:
            coord = f"({coord} % {size})"
        terms.append(coord if coeff == 1 else f"{coord} * {coeff}")
    return "(" + " + ".join(terms) + ")" if terms else "0"


def broadcast_offset(in_shape: tuple[int, ...], out_shape: tuple[int, ...], var: str = "i") -> str:
    """Offset into a contiguous ``in_shape`` tensor of output element ``var``."""
    if tuple(in_shape) == tuple(out_shape):
        return f"({var})"
    shape, (coeffs,) = collapse(tuple(out_shape), [broadcast_strides(in_shape, out_shape)])
    return offset_expr(shape, coeffs, var)
