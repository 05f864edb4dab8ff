"""Check a caller's feeds against a model's input specs before any backend sees them.

Every error names the tensor, what was expected and what was received. A
symbolic dimension (``"batch"``) must bind to one size across all inputs.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from backends.base import TensorSpec
from edge_runtime.errors import InvalidInputError


def validate_feeds(specs: list[TensorSpec], feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Return the feeds as numpy arrays; raise InvalidInputError on the first mistake.

    Arrays are not cast: a float64 array for a float32 input is an error, since
    a silent cast hides a caller bug and costs a copy on every request.
    """
    if not isinstance(feeds, Mapping):
        raise InvalidInputError(f"feeds must be a mapping of input name to array, got {type(feeds).__name__}")
    expected = {spec.name: spec for spec in specs}
    unknown = sorted(set(feeds) - set(expected))
    if unknown:
        raise InvalidInputError(f"unknown input(s) {unknown}; the model's inputs are {sorted(expected)}")
    missing = [name for name in expected if name not in feeds]
    if missing:
        raise InvalidInputError(f"missing input(s) {missing}; the model's inputs are {sorted(expected)}")
    bound: dict[str, tuple[int, str]] = {}
    arrays: dict[str, np.ndarray] = {}
    for spec in specs:
        array = _as_array(spec, feeds[spec.name])
        _check_shape(spec, array.shape, bound)
        arrays[spec.name] = array
    return arrays


def _as_array(spec: TensorSpec, value: Any) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        if isinstance(value, (np.generic, int, float, bool, list, tuple)):
            value = np.asarray(value, dtype=spec.dtype if not spec.dtype.startswith("onnx:") else None)
        else:
            raise InvalidInputError(
                f"input {spec.name!r}: expected a numpy array of {spec.dtype}, got {type(value).__name__}")
    if value.dtype.name != spec.dtype:
        raise InvalidInputError(
            f"input {spec.name!r}: expected dtype {spec.dtype}, got {value.dtype.name}")
    return value


def _check_shape(spec: TensorSpec, shape: tuple[int, ...], bound: dict[str, tuple[int, str]]) -> None:
    if len(shape) != len(spec.shape):
        raise InvalidInputError(
            f"input {spec.name!r}: expected rank {len(spec.shape)} (shape {_fmt(spec.shape)}), "
            f"got rank {len(shape)} (shape {list(shape)})")
    for axis, (want, got) in enumerate(zip(spec.shape, shape)):
        if isinstance(want, int) and want >= 0 and want != got:
            raise InvalidInputError(
                f"input {spec.name!r}: dimension {axis} must be {want} (shape {_fmt(spec.shape)}), "
                f"got {got} (shape {list(shape)})")
        if isinstance(want, str):
            previous = bound.setdefault(want, (got, spec.name))
            if previous[0] != got:
                raise InvalidInputError(
                    f"input {spec.name!r}: dimension {axis} ({want!r}) is {got}, but input "
                    f"{previous[1]!r} bound {want!r} to {previous[0]}")


def _fmt(shape: tuple[Any, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
