"""The load-time batching experiment runs only at shapes the model is served at; extra plans follow auto's
measurement.

The fake plan here takes only 48x192 images (as a pooling model would) and records every shape it
is asked to run: the oracle for "never an arbitrary size" is that record. For the plan filter,
the oracle is the race's own entries: a plan measured within the margin is compiled, others not.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pytest

from backends.base import TensorSpec
from edge_runtime.errors import InvalidInputError
from edge_runtime.scheduler.batch_probe import decide_batching
from edge_runtime.scheduler.config import BatchingConfig
from edge_runtime.served_shapes import request_shapes, served_shapes, static_shapes

SERVED = (48, 192)
DYNAMIC = [TensorSpec("x", "float32", (None, 3, "h", "w"))]
OUTPUTS = [TensorSpec("y", "float32", (None, 2))]


class PoolingPlan:
    """Row-wise mean over the image; raises for any image size but the served one."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = feeds["x"]
        self.shapes.append(x.shape)
        if x.shape[2:] != SERVED:
            raise InvalidInputError(f"pooling takes {SERVED}, got {x.shape[2:]}")
        return {"y": np.stack([x.mean(axis=(1, 2, 3)), x.max(axis=(1, 2, 3))], axis=1)}


def test_served_shapes_come_from_config_else_static_dims_else_nobody() -> None:
    assert served_shapes(DYNAMIC) == ()
    assert served_shapes(DYNAMIC, ({"x": (1, 3, *SERVED)},)) == ({"x": (1, 3, *SERVED)},)
    assert static_shapes([TensorSpec("x", "float32", ("batch", 3, 8)), TensorSpec("m", "int64", (2,))]) == {
        "x": (1, 3, 8), "m": (2,)}
    assert static_shapes([TensorSpec("x", "float32", (1, "seq"))]) is None
    feeds = {"x": np.zeros((5, 3, *SERVED), np.float32)}
    assert request_shapes(DYNAMIC, feeds) == {"x": (1, 3, *SERVED)}  # rows bound to 1 on a dynamic dim 0
    assert request_shapes(DYNAMIC, {}) is None


def test_without_served_shapes_the_experiment_is_deferred_and_runs_nothing() -> None:
    plan = PoolingPlan()
    decision = decide_batching(BatchingConfig(max_batch_size=8), DYNAMIC, OUTPUTS, plan.run)
    assert decision.deferred and not decision.enabled and plan.shapes == []


def test_with_configured_shapes_the_experiment_runs_only_at_them_and_enables_batching() -> None:
    plan = PoolingPlan()
    decision = decide_batching(BatchingConfig(max_batch_size=8), DYNAMIC, OUTPUTS, plan.run,
                               ({"x": [1, 3, *SERVED]},))
    assert decision.enabled and not decision.deferred, decision
    assert plan.shapes and all(shape[2:] == SERVED for shape in plan.shapes)
    # each row alone, then both joined; then the cost curve's sizes (batch_probe.measure_cost_curve)
    assert sorted({shape[0] for shape in plan.shapes}) == [1, 2, 4, 8]
    assert [rows for rows, _ in decision.cost_ms_per_row] == [1, 2, 4, 8]


def test_a_model_that_mixes_rows_at_its_served_shape_is_refused() -> None:
    def mixing(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = feeds["x"]
        centred = x.mean(axis=(1, 2, 3)) - x.mean()
        return {"y": np.stack([centred, centred], axis=1)}

    decision = decide_batching(BatchingConfig(max_batch_size=8), DYNAMIC, OUTPUTS, mixing, ({"x": [1, 3, *SERVED]},))
    assert not decision.enabled and "mixes rows" in decision.reason


def _decision(measured: Mapping[str, float], winner: str) -> Any:
    from edge_runtime.plan_race import PlanDecision, RaceEntry

    entries = tuple(RaceEntry(name, "plan", ("cpu",) if name == "cpu" else ("opencl",), 1.0, ms)
                    for name, ms in measured.items())
    return PlanDecision(winner, "plan", {"x": (1, 3, *SERVED)}, entries, "test")


@pytest.mark.parametrize(("measured", "kept"), [
    ({"cpu": 1.0, "gpu": 4.5, "hybrid": 2.0}, {"cpu"}),
    ({"cpu": 1.0, "gpu": 1.1, "hybrid": 3.0}, {"cpu", "gpu"}),
    ({"cpu": 1.2, "gpu": 1.0, "hybrid": 1.25}, {"cpu", "gpu", "hybrid"}),
])
def test_only_plans_measured_within_the_margin_are_worth_compiling(measured: dict, kept: set) -> None:
    from types import SimpleNamespace

    from edge_runtime.scheduler.factory import _worth_keeping

    winner = min(measured, key=measured.get)
    model = SimpleNamespace(name="m", backend=winner, report=SimpleNamespace(decision=_decision(measured, winner)))
    assert _worth_keeping(model) == kept
    unmeasured = SimpleNamespace(name="m", backend="cpu", report=SimpleNamespace(decision=None))
    assert _worth_keeping(unmeasured) == {"cpu", "gpu", "hybrid"}
