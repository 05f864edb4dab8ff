"""Plans: named ways of running one model, which the scheduler chooses between.

A plan takes validated feeds and returns outputs. ``backends`` says where it
runs (for results and metrics). The partitioner adds multi-stage plans; a
loaded ``Model`` gives the single-backend plan it was compiled for.

Plan names the policies know: ``"cpu"``, ``"gpu"``, ``"hybrid"`` (a partitioned
plan with GPU and CPU stages). Any other name (a single-backend model offers
its backend's name, e.g. ``"opencl"``) is classified by its backends.

Optional plan attributes the scheduler reads (``getattr`` with a default):

* ``device``: which device worker runs it (``"cpu"``, ``"gpu"``, ``"cloud"``);
  default derived from ``backends`` by :func:`plan_device`.
* ``estimated_ms``: the cost model's latency estimate, the cost policy's prior.
* ``reporting`` or ``run_reporting``: a run returning a ``PlanRun`` (outputs,
  plus which stage re-ran on the host and why), so stage fallbacks reach the
  result and the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from backends.descriptors import backends_on

# Read from the backend descriptors: whose work lands on a GPU, on a cloud peer; the rest use the CPU cores.
GPU_BACKENDS = backends_on("gpu")
CLOUD_BACKENDS = backends_on("cloud")
PLAN_KINDS = ("cpu", "gpu", "hybrid")


class Plan(Protocol):
    name: str
    backends: tuple[str, ...]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        ...


@dataclass(frozen=True)
class CallablePlan:
    """A plan backed by any ``feeds -> outputs`` callable (an executable's ``run``).

    ``device`` empty means "derive it from ``backends``"; ``estimated_ms``
    None means no prior latency estimate. ``reporting`` (a multi-stage
    executor's ``run_reporting``) runs it saying which stages fell back.
    """

    name: str
    backends: tuple[str, ...]
    call: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
    device: str = ""
    estimated_ms: float | None = None
    reporting: Callable[[Mapping[str, np.ndarray]], Any] | None = None

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.call(feeds)


def plan_device(plan: Plan) -> str:
    """The device worker a plan runs on: its ``device``, else ``gpu`` when any
    backend is a GPU backend (a hybrid plan's thread drives the GPU), ``cloud``
    for pure cloud plans, else ``cpu``."""
    device = getattr(plan, "device", "")
    if device:
        return str(device)
    backends = set(plan.backends)
    if backends & GPU_BACKENDS:
        return "gpu"
    if backends and backends <= CLOUD_BACKENDS:
        return "cloud"
    return "cpu"


def plan_kind(name: str, plan: Plan) -> str:
    """``cpu``, ``gpu`` or ``hybrid`` as the policies see it.

    The names ``cpu``/``gpu``/``hybrid`` are taken at their word; another name is
    ``gpu`` when every backend is a GPU one, ``hybrid`` when GPU and other
    backends mix, else ``cpu``.
    """
    if name in PLAN_KINDS:
        return name
    backends = set(plan.backends)
    if backends & GPU_BACKENDS:
        return "hybrid" if backends - GPU_BACKENDS else "gpu"
    # A stand-in placed on the GPU worker (tests, a delegate-backed plan) counts as a GPU plan.
    return "gpu" if getattr(plan, "device", "") == "gpu" else "cpu"


def model_plan(name: str, model: Any) -> CallablePlan:
    """A loaded ``Model`` as plan ``name``, running without re-validation; a thread-safe multi-stage
    executable also reports its stage fallbacks."""
    executable = getattr(model, "executable", None)
    reporting = getattr(executable, "run_reporting", None) if getattr(executable, "thread_safe", False) else None
    # The executable's own device wins (a .tflite model on a GPU delegate is a GPU plan); without
    # one, plan_device derives it from the backends' descriptors.
    device = getattr(executable, "device", "")
    return CallablePlan(name, tuple(model.backend_nodes), model._run_validated, device=device, reporting=reporting)


def model_plans(model: Any) -> dict[str, Plan]:
    """The single plan of a loaded ``Model``: its backend (``model_plan``)."""
    return {model.backend: model_plan(model.backend, model)}
