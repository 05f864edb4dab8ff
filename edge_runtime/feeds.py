"""Seeded random inputs for a model's input specs (``run`` without ``--input``, the demo)."""

from __future__ import annotations

import numpy as np

from backends.base import TensorSpec


def random_feeds(specs: list[TensorSpec], seed: int = 0, dynamic_dim: int = 1) -> dict[str, np.ndarray]:
    """One array per input; symbolic or unknown dimensions become ``dynamic_dim``."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        shape = [d if isinstance(d, int) and d >= 0 else dynamic_dim for d in spec.shape]
        dtype = np.dtype(spec.dtype)
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            feeds[spec.name] = rng.integers(max(info.min, -8), min(info.max, 8), size=shape, dtype=dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = rng.random(shape) < 0.5
        else:
            raise ValueError(f"input {spec.name!r}: cannot make random data of dtype {spec.dtype}")
    return feeds
