"""One batch on one plan, in a device worker's thread: join the rows, run, fall back, split.

``run_batch`` joins the requests' feeds along dim 0, runs the chosen plan and
cuts the outputs back per request. A multi-stage plan reports a stage that
re-ran on the host (``reporting`` / ``run_reporting``: a ``PlanRun``); a plan
that fails with ``BackendError`` is re-run on the cpu plan, and either way the
``PlanFailure`` says why, for the result's ``fallback`` and the metrics.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping, Sequence

import numpy as np

from edge_runtime.errors import BackendError
from edge_runtime.scheduler.batching import join_feeds, split_outputs
from edge_runtime.scheduler.plans import Plan
from edge_runtime.scheduler.request import PlanFailure

log = logging.getLogger(__name__)

BatchRun = tuple[list[dict[str, np.ndarray]], float, float, str, "PlanFailure | None"]
"""Per-request outputs, started and finished (``time.monotonic``), the plan that ran, why it fell back."""


def run_batch(model: str, plans: Mapping[str, Plan], plan_name: str, cpu_plan: str | None,
              feeds: Sequence[Mapping[str, np.ndarray]], rows: Sequence[int], gpu_monitor: Any = None) -> BatchRun:
    """Run ``feeds`` (one mapping per request, ``rows`` each) on plan ``plan_name``.

    Raises BackendError when the plan fails and no other cpu plan can answer;
    ``gpu_monitor`` (a LoadMonitor) is told how long the GPU was busy.
    """
    started = time.monotonic()
    joined = join_feeds(feeds)
    ran, failure = plan_name, None
    plan = plans[plan_name]
    reporting = getattr(plan, "reporting", None) or getattr(plan, "run_reporting", None)
    try:
        if reporting is None:
            outputs = plan.run(joined)
        else:  # a multi-stage plan: a stage that re-ran on the host is reported, not only logged
            report = reporting(joined)
            outputs = report.outputs
            if report.fallback:
                failure = PlanFailure(report.fallback, labels=report.labels)
    except BackendError as exc:
        if cpu_plan is None or cpu_plan == plan_name:
            raise
        log.warning("model %s: plan %s failed (%s); re-running on %s", model, plan_name, exc, cpu_plan)
        ran, failure = cpu_plan, PlanFailure.of(plan_name, exc)
        outputs = plans[ran].run(joined)
    if gpu_monitor is not None:
        gpu_monitor.note_gpu_busy(started, time.monotonic())
    return split_outputs(outputs, rows), started, time.monotonic(), ran, failure
