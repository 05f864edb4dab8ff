"""Whether a model really batches: decided once at load, by experiment, not from its declared shapes.

A declared dynamic dim 0 (symbolic, ``?``, or ``dim_value`` -1/0 as paddle2onnx and
tf2onnx write) says only that any size is accepted, not that rows are independent: a
model that normalises over dim 0, or reshapes it into another axis, mixes rows, and
joining two requests would change both answers. So ``decide_batching`` runs two
different seeded rows joined into one batch and one at a time, and enables batching
only when every output comes back with one row per input row and each row equals its
single-row run within fp32 tolerance. Dynamic dims other than dim 0 take the model's
served shapes (``edge_runtime.served_shapes``), never an arbitrary size the model may
reject (PP-OCR's pooling takes no 1x1 or 32x32 image); when nothing says them yet the
experiment is deferred to the first request (``deferred``: batching stays off until
``probe_served`` has run at that request's shapes, off its critical path).

``BatchingDecision`` (enabled, reason, max_batch_size) is what the scheduler serves
by and what the model's metadata reports as ``edge_runtime.batching``. Where batching
is enabled at load, ``measure_cost_curve`` also times a run at 1, 2, 4, ... rows (up to
``max_batch_size``, within a small time budget) so the batcher knows the per-row cost
curve from the first request (``cost_curve.py``); a deferred decision learns it live.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Sequence

import numpy as np

from backends.base import TensorSpec
from edge_runtime.errors import EdgeRuntimeError
from edge_runtime.scheduler.config import BatchingConfig
from edge_runtime.served_shapes import ShapeSet, served_shapes

_RTOL, _ATOL = 1e-3, 1e-4  # fp32: batched kernels may sum in another order; atol scales with |output|
_SEED = 20240611
COST_BUDGET_S = 0.5  # load time spent on the cost curve at most (plus the run that crosses it)
COST_REPEATS = 3

Run = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]
AsyncRun = Callable[[Mapping[str, np.ndarray]], Awaitable[Mapping[str, np.ndarray]]]
DEFERRED = "deferred: a dynamic dim besides dim 0 has no served shape yet; probed at the first request's shapes"


@dataclass(frozen=True)
class BatchingDecision:
    """Whether requests of this model are joined into batches, and why (one line)."""

    enabled: bool
    reason: str
    max_batch_size: int = 0
    deferred: bool = False  # the experiment waits for the first request's shapes (batching off meanwhile)
    cost_ms_per_row: tuple[tuple[int, float], ...] = ()  # measured at load: (rows, ms per row)

    def to_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "reason": self.reason,
                "max_batch_size": self.max_batch_size if self.enabled else 1, "deferred": self.deferred,
                **({"cost_ms_per_row": {str(r): ms for r, ms in self.cost_ms_per_row}}
                   if self.cost_ms_per_row else {})}


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
                    run: Run | None, shapes: Sequence[ShapeSet] = ()) -> BatchingDecision:
    """The decision for a model with ``config`` (see the module docstring); ``run`` None skips the experiment.

    ``shapes``: the configured served shape sets (``[warmup] shapes``); without them the
    model's static dims, else the decision is ``deferred``. Blocking (three small runs);
    never raises for the model's sake: a probe that cannot run refuses batching and says why.
    """
    if not config.enabled:
        return BatchingDecision(False, "not configured ([batching] max_batch_size <= 1)")
    why_not = declared_batch_dim(inputs, outputs)
    if why_not is not None:
        return BatchingDecision(False, why_not)
    if run is None:
        return BatchingDecision(True, "dim 0 is dynamic on every input and output (not probed)",
                                config.max_batch_size)
    served = served_shapes(inputs, shapes)
    if not served:
        return BatchingDecision(False, DEFERRED, config.max_batch_size, deferred=True)
    pair, singles = probe_feeds(inputs, served[0])
    try:
        alone = [run(feeds) for feeds in singles]
    except (EdgeRuntimeError, ValueError, RuntimeError) as exc:
        return verdict(config, f"probe: one row at the served shape fails to run ({str(exc)[:200]})")
    try:
        joined = run(pair)
    except (EdgeRuntimeError, ValueError, RuntimeError) as exc:
        return verdict(config, f"probe: two rows joined fail to run ({str(exc)[:200]})")
    decision = verdict(config, _compare(joined, alone))
    if not decision.enabled:
        return decision
    return dataclasses.replace(decision, cost_ms_per_row=measure_cost_curve(run, inputs, served[0],
                                                                             config.max_batch_size))


def measure_cost_curve(run: Run, inputs: Sequence[TensorSpec], shapes: ShapeSet, max_rows: int,
                       budget_s: float = COST_BUDGET_S) -> tuple[tuple[int, float], ...]:
    """ms per row of ``run`` at 1, 2, 4, ... ``max_rows`` rows (best of a few runs each; a warm-up run
    first), stopping at the size where ``budget_s`` runs out; a size that fails to run ends it."""
    sizes = sorted({min(max_rows, 1 << k) for k in range(max(1, max_rows).bit_length() + 1)})
    curve: list[tuple[int, float]] = []
    stop_at = time.monotonic() + budget_s
    for rows in sizes:
        feeds = _sample(inputs, rows=rows, shapes=shapes)
        times = []
        try:
            for _ in range(1 + COST_REPEATS):  # the first is a warm-up (arena growth at a new shape)
                started = time.perf_counter()
                run(feeds)
                times.append(time.perf_counter() - started)
        except (EdgeRuntimeError, ValueError, RuntimeError):
            break
        curve.append((rows, round(min(times[1:]) * 1e3 / rows, 4)))
        if time.monotonic() > stop_at:
            break
    return tuple(curve)


async def probe_served(config: BatchingConfig, inputs: Sequence[TensorSpec], shapes: ShapeSet,
                       run: AsyncRun) -> BatchingDecision:
    """The deferred experiment at a request's ``shapes`` (rows bound to 1), through ``run`` (the
    scheduler's queue, so it shares the device worker with real requests instead of racing them)."""
    pair, singles = probe_feeds(inputs, shapes)
    try:
        alone = [await run(feeds) for feeds in singles]
        joined = await run(pair)
    except (EdgeRuntimeError, ValueError, RuntimeError) as exc:
        return verdict(config, f"probe at the first request's shapes failed to run ({str(exc)[:200]})")
    return verdict(config, _compare(joined, alone))


def verdict(config: BatchingConfig, mixed: str | None) -> BatchingDecision:
    """The decision from the experiment's finding (None: rows are independent)."""
    if mixed is not None:
        return BatchingDecision(False, mixed)
    return BatchingDecision(True, "probed: two rows run joined equal the rows run one at a time",
                            config.max_batch_size)


def probe_feeds(inputs: Sequence[TensorSpec], shapes: ShapeSet) -> tuple[dict[str, np.ndarray],
                                                                            list[dict[str, np.ndarray]]]:
    """Two different seeded rows at ``shapes`` joined into one batch, and each row alone."""
    pair = _sample(inputs, rows=2, shapes=shapes)
    return pair, [{name: array[i:i + 1] for name, array in pair.items()} for i in range(2)]


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


def _sample(inputs: Sequence[TensorSpec], *, rows: int, shapes: ShapeSet) -> dict[str, np.ndarray]:
    """Seeded inputs with ``rows`` rows and the other dims of ``shapes`` (declared dims where it names none)."""
    rng = np.random.default_rng(_SEED)
    feeds = {}
    for spec in inputs:
        served = shapes.get(spec.name)
        rest = list(served[1:]) if served is not None else [d if isinstance(d, int) and d > 0 else 1
                                                            for d in spec.shape[1:]]
        feeds[spec.name] = _values(rng, spec.dtype, [rows, *rest])
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
