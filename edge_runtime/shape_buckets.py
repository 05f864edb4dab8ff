"""Shape buckets: round a dynamic input dimension up to a configured size, so new sizes reuse compiled ones.

Backends that specialise per input shape (OpenCL builds and tunes kernels for
each new shape; LiteRT re-allocates) pay a compile on the hot path for every
new size. With buckets, a request's dimension is padded up to the next
configured size; the set of shapes a model ever sees is then the buckets,
which warm-up compiles at load.

Padding changes what the model computes, so it is only done where the model
is declared to tolerate it (``pad = true``): a text-line recogniser padded on
the right with background, a detector padded at the bottom/right with zeros.
The outputs are the padded request's, as the model computes them (a CTC
recogniser gives extra blank steps; a detector's maps grow by the padded
border). Without ``pad`` nothing is changed: every exact shape compiles once
and the backend keeps an LRU of its specialisations (OpenCL:
``max_specialisations``); the buckets still tell warm-up which shapes to
compile first. Per model, in its ``config.toml``::

    [shape_buckets]
    pad = true
    dims = [{ input = "x", axis = 3, sizes = [160, 320, 640], pad_value = 0.0 }]

A size above the largest bucket is left exact.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from backends.base import TensorSpec
from edge_runtime.errors import ConfigError


@dataclass(frozen=True)
class BucketDim:
    input: str
    axis: int
    sizes: tuple[int, ...]
    pad_value: float = 0.0


@dataclass(frozen=True)
class ShapeBuckets:
    pad: bool = False
    dims: tuple[BucketDim, ...] = ()

    def apply(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``feeds`` with each bucketed dimension padded up to its bucket (only with ``pad``)."""
        if not self.pad or not self.dims:
            return dict(feeds)
        out = dict(feeds)
        for dim in self.dims:
            array = out.get(dim.input)
            if array is None or array.ndim <= dim.axis:
                continue
            size = array.shape[dim.axis]
            index = bisect.bisect_left(dim.sizes, size)
            if index == len(dim.sizes) or dim.sizes[index] == size:
                continue  # above the largest bucket, or already a bucket size: exact
            widths = [(0, 0)] * array.ndim
            widths[dim.axis] = (0, dim.sizes[index] - size)
            out[dim.input] = np.pad(array, widths, constant_values=np.asarray(dim.pad_value, array.dtype))
        return out

    def warmup_shapes(self, specs: Sequence[TensorSpec]) -> tuple[dict[str, tuple[int, ...]], ...]:
        """One shape set per bucket size (dims of one input bucketed together; other dims static, else 1)."""
        by_input: dict[str, list[BucketDim]] = {}
        for dim in self.dims:
            by_input.setdefault(dim.input, []).append(dim)
        sets = []
        count = max((len(d.sizes) for d in self.dims), default=0)
        for k in range(count):
            shapes = {}
            for spec in specs:
                if spec.name not in by_input:
                    continue
                shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec.shape]
                for dim in by_input[spec.name]:
                    shape[dim.axis] = dim.sizes[min(k, len(dim.sizes) - 1)]
                shapes[spec.name] = tuple(shape)
            sets.append(shapes)
        return tuple(sets)


def shape_buckets_config(table: Mapping[str, Any] | None, specs: Sequence[TensorSpec], where: str) -> ShapeBuckets:
    """The model's ``[shape_buckets]`` table, checked against its inputs; ConfigError names the key."""
    if table is None:
        return ShapeBuckets()
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: [shape_buckets] must be a table")
    unknown = sorted(set(table) - {"pad", "dims"})
    if unknown:
        raise ConfigError(f"{where}: [shape_buckets] unknown key(s) {unknown}; known: ['dims', 'pad']")
    pad = table.get("pad", False)
    if not isinstance(pad, bool):
        raise ConfigError(f"{where}: [shape_buckets] pad must be true or false, got {pad!r}")
    by_name = {s.name: s for s in specs}
    dims = []
    for entry in table.get("dims", []):
        if not isinstance(entry, Mapping) or set(entry) - {"input", "axis", "sizes", "pad_value"}:
            raise ConfigError(f"{where}: [shape_buckets] dims entries are {{ input, axis, sizes, pad_value }}, "
                              f"got {entry!r}")
        spec = by_name.get(entry.get("input"))
        if spec is None:
            raise ConfigError(f"{where}: [shape_buckets] input {entry.get('input')!r} is not an input of the model; "
                              f"inputs: {sorted(by_name)}")
        axis, sizes = entry.get("axis"), entry.get("sizes")
        if not isinstance(axis, int) or not 0 <= axis < len(spec.shape) or isinstance(spec.shape[axis], int) and \
                spec.shape[axis] > 0:
            raise ConfigError(f"{where}: [shape_buckets] axis {axis!r} of {spec.name!r} must be a dynamic dim of "
                              f"{list(spec.shape)}")
        if not isinstance(sizes, list) or not sizes or not all(isinstance(s, int) and s > 0 for s in sizes):
            raise ConfigError(f"{where}: [shape_buckets] sizes must be a list of positive integers, got {sizes!r}")
        dims.append(BucketDim(spec.name, axis, tuple(sorted(set(sizes))), float(entry.get("pad_value", 0.0))))
    return ShapeBuckets(pad, tuple(dims))
