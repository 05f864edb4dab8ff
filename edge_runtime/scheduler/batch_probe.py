"""Whether a model really batches: decided once at load, by experiment, not from its declared shapes.

A declared dynamic dim 0 (symbolic, ``?``, or ``dim_value`` -1/0 as paddle2onnx and
tf2onnx write) says only that any size is accepted, not that rows are independent: a
model that normalises over dim 0, or reshapes it into another axis, mixes rows, and
joining two requests would change both answers. So ``decide_batching`` runs two
different seeded rows joined into one batch and one at a time, and enables batching
only when every output comes back with one row per input row and each row equals its
single-row run within fp32 tolerance. Dynamic dims other than dim 0 are bound to the
first of a few sizes the model accepts.

``BatchingDecision`` (enabled, reason, max_batch_size) is what the scheduler serves
by and what the model's metadata reports as ``edge_runtime.batching``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from backends.base import TensorSpec
from edge_runtime.errors import EdgeRuntimeError
from edge_runtime.scheduler.config import BatchingConfig

# Sizes tried for dynamic non-batch dims: small first (a cheap probe), then common image sizes.
_FREE_DIM_SIZES = (32, 64, 224, 16, 8, 1)
_RTOL, _ATOL = 1e-3, 1e-4  # fp32: batched kernels may sum in another order; atol scales with |output|
_SEED = 20240611

Run = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class BatchingDecision:
    """Whether requests of this model are joined into batches, and why (one line)."""

    enabled: bool
    reason: str
    max_batch_size: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "reason": self.reason,
                "max_batch_size": self.max_batch_size if self.enabled else 1}


def declared_batch_dim(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> str | None:
    """None when dim 0 of every input and output is dynamic, else why not (naming the tensor)."""
    if not inputs:
        return "the model has no inputs"
    for spec in [*inputs, *outputs]:
        if not spec.shape:
            return f"{spec.name!r} is a scalar (no dim 0 to batch on)"
        if isinstance(spec.shape[0], int):
            return f"dim 0 of {spec.name!r} is fixed at {spec.shape[0]}"
    return None


def decide_batching(config: BatchingConfig, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                    run: Run | None) -> BatchingDecision:
    """The decision for a model with ``config`` (see the module docstring); ``run`` None skips the experiment.

    Blocking (two to a dozen small runs); never raises for the model's sake: a
    probe that cannot run refuses batching and says why.
    """
    if not config.enabled:
        return BatchingDecision(False, "not configured ([batching] max_batch_size <= 1)")
    why_not = declared_batch_dim(inputs, outputs)
    if why_not is not None:
        return BatchingDecision(False, why_not)
    if run is None:
        return BatchingDecision(True, "dim 0 is dynamic on every input and output (not probed)",
                                config.max_batch_size)
    mixed = _rows_mix(inputs, run)
    if mixed is not None:
        return BatchingDecision(False, mixed)
    return BatchingDecision(True, "probed: two rows run joined equal the rows run one at a time",
                            config.max_batch_size)


def _rows_mix(inputs: Sequence[TensorSpec], run: Run) -> str | None:
    """None when rows are independent; else what the experiment found."""
    last_error = "no probe ran"
    for size in _FREE_DIM_SIZES:
        pair = _sample(inputs, rows=2, free=size)
        singles = [{name: array[i:i + 1] for name, array in pair.items()} for i in range(2)]
        try:
            alone = [run(feeds) for feeds in singles]
        except (EdgeRuntimeError, ValueError, RuntimeError) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
            continue  # this size does not fit the model: try the next
        try:
            joined = run(pair)
        except (EdgeRuntimeError, ValueError, RuntimeError) as exc:
            return f"probe: two rows joined fail to run ({str(exc)[:200]})"
        return _compare(joined, alone)
    return f"probe: no input size ran one row ({last_error[:200]})"


def _compare(joined: Mapping[str, np.ndarray], alone: Sequence[Mapping[str, np.ndarray]]) -> str | None:
    for name, batch in joined.items():
        batch = np.asarray(batch)
        if batch.ndim == 0 or batch.shape[0] != 2:
            return f"probe: output {name!r} has shape {list(batch.shape)} for 2 input rows (not one row per row)"
        for row, single in enumerate(alone):
            expected = np.asarray(single[name])
            if expected.shape[:1] != (1,) or batch[row:row + 1].shape != expected.shape:
                return (f"probe: output {name!r} row {row} has shape {list(batch[row:row + 1].shape)} joined, "
                        f"{list(expected.shape)} alone")
            if not _close(batch[row:row + 1], expected):
                diff = _max_diff(batch[row:row + 1], expected)
                return (f"probe: output {name!r} row {row} differs when run joined with another row "
                        f"(max |diff| {diff:.3g}): the model mixes rows along dim 0")
    return None


def _close(got: np.ndarray, expected: np.ndarray) -> bool:
    if got.dtype.kind in "fc":
        scale = float(np.max(np.abs(expected))) if expected.size else 0.0
        return bool(np.allclose(got, expected, rtol=_RTOL, atol=_ATOL * max(1.0, scale), equal_nan=True))
    return bool(np.array_equal(got, expected))


def _max_diff(got: np.ndarray, expected: np.ndarray) -> float:
    if got.dtype.kind not in "fciub":
        return float("nan")
    return float(np.max(np.abs(got.astype(np.float64) - expected.astype(np.float64)))) if got.size else 0.0


def _sample(inputs: Sequence[TensorSpec], *, rows: int, free: int) -> dict[str, np.ndarray]:
    """Seeded inputs with ``rows`` rows: symbolic dims bound once across inputs, unknown ones to ``free``."""
    rng = np.random.default_rng(_SEED)
    bound: dict[str, int] = {}
    feeds = {}
    for spec in inputs:
        shape = [rows] + [d if isinstance(d, int) else bound.setdefault(d, free) if isinstance(d, str) else free
                          for d in spec.shape[1:]]
        feeds[spec.name] = _values(rng, spec.dtype, shape)
    return feeds


def _values(rng: np.random.Generator, dtype: str, shape: list[int]) -> np.ndarray:
    kind = np.dtype(dtype).kind if not dtype.startswith("onnx:") and dtype != "object" else "O"
    if kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if kind in "iu":
        return rng.integers(0, 4, size=shape).astype(dtype)  # small: safe as indices or token ids
    if kind == "b":
        return rng.random(shape) < 0.5
    return np.array([f"row{i}" for i in range(int(np.prod(shape)))], dtype=object).reshape(shape)
