"""The input shapes a model is served at, for whatever must run it before real requests arrive.

Warm-up, the load-time batching experiment and any load-time timing must run
the model on inputs it takes. A dynamic spatial dim bound to an arbitrary size
is not one: PP-OCR's classifier declares ``x`` as ``[-1, 3, ?, ?]`` and its
pooling rejects 1x1 and 32x32 images. So the served shapes come, in order, from:

1. the model's ``config.toml``: ``[warmup] shapes`` (what the operator says it serves);
2. the model's declared dims, when only dim 0 (the batch) is dynamic: bound to 1 row;
3. nobody yet: ``served_shapes`` returns ``()`` and the caller defers to the first
   real request, whose shapes ``request_shapes`` records (``edge_runtime.deferred_warmup``).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from backends.base import TensorSpec

ShapeSet = Mapping[str, tuple[int, ...]]


def is_fixed(dim: object) -> bool:
    """A declared dim with a known size (ONNX writes a dynamic one as a name, None, -1 or 0)."""
    return isinstance(dim, int) and dim > 0


def static_shapes(specs: Sequence[TensorSpec]) -> dict[str, tuple[int, ...]] | None:
    """One shape set from the declared dims, a dynamic dim 0 bound to 1 row; None when any
    other dim is dynamic (its size is unknown until a request tells it)."""
    shapes = {}
    for spec in specs:
        dims = list(spec.shape)
        if any(not is_fixed(d) for d in dims[1:]):
            return None
        shapes[spec.name] = tuple(d if is_fixed(d) else 1 for d in dims)
    return shapes


def served_shapes(specs: Sequence[TensorSpec],
                  configured: Sequence[ShapeSet] = ()) -> tuple[ShapeSet, ...]:
    """The shape sets to run the model at before it serves (see the module docstring); ``()``: defer.

    Configured sets are returned as given (an input they leave out takes its declared dims:
    ``edge_runtime.warmup.sample_feeds``).
    """
    if configured:
        return tuple(configured)
    static = static_shapes(specs)
    return (static,) if static is not None else ()


def request_shapes(specs: Sequence[TensorSpec], feeds: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]] | None:
    """A request's shape set with its rows bound to 1 where dim 0 is dynamic (None: an input missing)."""
    shapes = {}
    for spec in specs:
        array = feeds.get(spec.name)
        if array is None:
            return None
        shape = tuple(int(d) for d in np.shape(array))
        if shape and spec.shape and not is_fixed(spec.shape[0]):
            shape = (1, *shape[1:])
        shapes[spec.name] = shape
    return shapes
