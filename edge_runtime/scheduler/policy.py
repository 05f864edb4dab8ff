"""Plan-choice policies: which plan runs the next request (or batch), given live load.

A registry maps the ``[scheduler] policy`` name to a class:

* ``threshold`` — the rule from the field: offload to the GPU plan while GPU
  busy < ``gpu_busy_threshold``; otherwise the partitioned (``hybrid``) plan if
  the model has one, else ``cpu``.
* ``cost`` — the plan with the lowest estimated latency: learned compute x
  current load + expected wait for the plan's device, with a little
  exploration so estimates of unchosen plans stay true.
* ``fixed`` — always one named plan (``plan = "cpu"``; ``"auto"`` = the model's
  default plan).

Every policy copes with a single plan (it is always chosen) and with plans
it has no role for (a ``cloud`` plan is only chosen by ``fixed`` or ``cost``).
Policies are called on the event loop only; they need no locks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Mapping, Protocol

from edge_runtime.errors import ConfigError
from edge_runtime.load_monitor import LoadReading
from edge_runtime.scheduler.config import POLICIES, SchedulerConfig
from edge_runtime.scheduler.plans import Plan, plan_kind

MAX_LOAD = 0.9  # a load share above this is treated as 0.9: estimates stay finite (x10 at most)


@dataclass(frozen=True)
class DecisionContext:
    """What a policy may look at: the load snapshot and, per plan, the expected wait for its device
    in run-lengths (0: a slot is free; 1: about one run of that plan must finish first)."""

    reading: LoadReading = field(default_factory=LoadReading)
    queue_wait_runs: Mapping[str, float] = field(default_factory=dict)
    rows: int = 1  # rows the next run is expected to carry


@dataclass(frozen=True)
class Decision:
    plan: str
    reason: str
    explored: bool = False


class Policy(Protocol):
    name: str

    def choose(self, context: DecisionContext) -> Decision:
        ...

    def observe(self, plan: str, compute_ms: float, rows: int, reading: LoadReading, ok: bool = True) -> None:
        """Learn from a finished run (``ok`` False: the plan failed and fell back)."""
        ...

    def estimates_ms(self) -> dict[str, float]:
        """Learned unloaded compute per row, per plan (empty for policies that learn nothing)."""
        ...


def _by_kind(plans: Mapping[str, Plan]) -> dict[str, list[str]]:
    """Plan names per kind, the plan literally named after the kind first."""
    kinds: dict[str, list[str]] = {"cpu": [], "gpu": [], "hybrid": []}
    for name, plan in plans.items():
        kinds[plan_kind(name, plan)].append(name)
    for kind, names in kinds.items():
        names.sort(key=lambda n: n != kind)
    return kinds


class FixedPolicy:
    """One plan, always: ``config.plan``, or ``default_plan`` for ``"auto"``."""

    name = "fixed"

    def __init__(self, config: SchedulerConfig, plans: Mapping[str, Plan], default_plan: str | None = None) -> None:
        wanted = (default_plan or next(iter(plans))) if config.plan == "auto" else config.plan
        if wanted not in plans:
            raise ConfigError(f"[scheduler] plan {wanted!r} is not a plan of this model; plans: {sorted(plans)}")
        self.plan = wanted

    def choose(self, context: DecisionContext) -> Decision:
        return Decision(self.plan, "fixed")

    def observe(self, plan: str, compute_ms: float, rows: int, reading: LoadReading, ok: bool = True) -> None:
        return None

    def estimates_ms(self) -> dict[str, float]:
        return {}


class ThresholdPolicy:
    """GPU while its busy share is under the threshold, else hybrid, else cpu.

    An unknown GPU busy (no monitor, no counter) counts as idle: the GPU plan
    is taken. With no GPU plan the rule falls through to hybrid, cpu, then the
    first plan; with only a GPU plan that plan runs whatever the load.
    """

    name = "threshold"

    def __init__(self, config: SchedulerConfig, plans: Mapping[str, Plan], default_plan: str | None = None) -> None:
        self.threshold = config.gpu_busy_threshold
        kinds = _by_kind(plans)
        self._gpu = kinds["gpu"][0] if kinds["gpu"] else None
        fallbacks = kinds["hybrid"] + kinds["cpu"]
        self._fallback = fallbacks[0] if fallbacks else (self._gpu or default_plan or next(iter(plans)))

    def choose(self, context: DecisionContext) -> Decision:
        busy = context.reading.gpu_busy
        if self._gpu is not None and (busy is None or busy < self.threshold):
            shown = "unknown" if busy is None else f"{busy:.2f}"
            return Decision(self._gpu, f"gpu_busy {shown} < {self.threshold:.2f}")
        shown = "n/a" if busy is None else f"{busy:.2f}"
        return Decision(self._fallback, f"gpu_busy {shown} >= {self.threshold:.2f}" if self._gpu else "no gpu plan")

    def observe(self, plan: str, compute_ms: float, rows: int, reading: LoadReading, ok: bool = True) -> None:
        return None

    def estimates_ms(self) -> dict[str, float]:
        return {}


class CostPolicy:
    """Lowest estimated latency: ``ms_per_row x rows x load_factor x (1 + queue_wait_runs)``.

    ``ms_per_row`` is an EWMA (weight ``ALPHA``) of each plan's compute per row
    with the load at run time divided out, so it stays an *unloaded* figure;
    it starts at the plan's ``estimated_ms`` (the cost model) when given, else
    the first measurement (a plan with neither is tried first). The load
    factor is ``1 / (1 - others' share)``: CPU utilisation for cpu plans, GPU
    busy for gpu plans, the larger for hybrid. A failed run (or one that fell
    back to cpu) sets the plan's estimate to twice the worst known estimate. With probability ``explore_fraction`` (seeded RNG, so runs are
    reproducible) a decision goes to another plan to keep its estimate true.

    NOTE: per-row cost mildly favours the plan that has been running large
    batches (its per-row figure amortises fixed costs); exploration batches are
    formed by the same rules, so under steady load both see similar sizes.
    """

    name = "cost"
    ALPHA = 0.3

    def __init__(self, config: SchedulerConfig, plans: Mapping[str, Plan], default_plan: str | None = None) -> None:
        self._kinds = {name: plan_kind(name, plan) for name, plan in plans.items()}
        self._ms_per_row: dict[str, float | None] = {
            name: _prior(plan) for name, plan in plans.items()}
        self._explore = config.explore_fraction
        self._rng = random.Random(config.seed)

    def load_factor(self, plan: str, reading: LoadReading) -> float:
        kind = self._kinds[plan]
        cpu = _factor(reading.cpu_busy_others)
        gpu = _factor(reading.gpu_busy_others)
        return {"cpu": cpu, "gpu": gpu}.get(kind, max(cpu, gpu))

    def estimate_ms(self, plan: str, context: DecisionContext) -> float | None:
        """Expected latency of ``plan`` for ``context.rows`` rows now; None before any data."""
        per_row = self._ms_per_row[plan]
        if per_row is None:
            return None
        compute = per_row * max(1, context.rows) * self.load_factor(plan, context.reading)
        return compute * (1.0 + context.queue_wait_runs.get(plan, 0.0))

    def choose(self, context: DecisionContext) -> Decision:
        names = list(self._ms_per_row)
        if len(names) == 1:
            return Decision(names[0], "only plan")
        unmeasured = [name for name in names if self._ms_per_row[name] is None]
        if unmeasured:
            return Decision(unmeasured[0], "no estimate yet: measuring", explored=True)
        estimates = {name: self.estimate_ms(name, context) for name in names}
        best = min(names, key=lambda name: estimates[name])
        if self._rng.random() < self._explore:
            other = self._rng.choice([name for name in names if name != best])
            return Decision(other, f"exploring ({best} estimated {estimates[best]:.2f} ms, "
                                   f"{other} {estimates[other]:.2f} ms)", explored=True)
        return Decision(best, f"estimated {estimates[best]:.2f} ms")

    def observe(self, plan: str, compute_ms: float, rows: int, reading: LoadReading, ok: bool = True) -> None:
        if plan not in self._ms_per_row:
            return
        previous = self._ms_per_row[plan]
        sample = compute_ms / max(1, rows) / self.load_factor(plan, reading)
        if not ok:
            # A failing plan becomes the worst known, doubled: avoided until exploration re-tries it.
            known = [v for n, v in self._ms_per_row.items() if v is not None and n != plan]
            self._ms_per_row[plan] = 2.0 * max(previous or 0.0, sample, *known, 1e-3)
            return
        self._ms_per_row[plan] = sample if previous is None else previous + self.ALPHA * (sample - previous)

    def estimates_ms(self) -> dict[str, float]:
        return {name: round(value, 4) for name, value in self._ms_per_row.items() if value is not None}


def _prior(plan: Plan) -> float | None:
    estimated = getattr(plan, "estimated_ms", None)
    return float(estimated) if estimated else None


def _factor(share: float | None) -> float:
    return 1.0 / (1.0 - min(MAX_LOAD, max(0.0, share or 0.0)))


REGISTRY: dict[str, type] = {"threshold": ThresholdPolicy, "cost": CostPolicy, "fixed": FixedPolicy}
assert tuple(sorted(REGISTRY)) == tuple(sorted(POLICIES)), "config.POLICIES and the registry must agree"


def make_policy(config: SchedulerConfig, plans: Mapping[str, Plan], default_plan: str | None = None) -> Policy:
    """The policy ``config.policy`` names, built for ``plans``; raises ConfigError for a bad fixed plan."""
    if not plans:
        raise ConfigError("a policy needs at least one plan")
    return REGISTRY[config.policy](config, plans, default_plan)
