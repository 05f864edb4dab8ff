"""Re-checking the served plan against its candidates from live latencies.

``auto`` picks a plan at load by measurement (``plan_race``), but a decision
can go stale: read from a cache written under other conditions, or the device
slowed one engine since (another app on the GPU, a thermal cap). The scheduler
therefore keeps the candidates measured close to the winner (and ``cpu``,
which is always cheap to hold) as plans, and ``PlanRecheck``:

* sends a probe every ``PROBE_EVERY`` decisions to a candidate still short of
  ``MIN_SAMPLES`` runs (marked as exploring), so every side has live figures
  even under the ``fixed`` policy. A probe is two runs back to back, of which
  only the second is timed: the first wakes a candidate that sat idle since its
  last probe (a pool's threads asleep, its weights out of cache), which the served
  plan, running back to back, does not pay;
* abandons the served plan once the lower quartile of its last runs (compute
  ms per row; ``_speed`` says why not the median) is over ``ABANDON_RATIO``
  times a candidate's, both with at least ``MIN_SAMPLES`` runs, or when most
  of its runs failed: from then on its decisions go to that candidate. It is
  logged at INFO once and counted (``abandoned``: plan and reason), which the
  server exports as ``edge_runtime_plan_abandoned_total``.

An abandoned plan is not probed again (no flapping); a plan the operator fixed
by name (``[scheduler] plan = "gpu"``) is never re-checked.
"""

from __future__ import annotations

import logging
import statistics
from collections import Counter, deque
from typing import Any, Mapping, Sequence

from edge_runtime.scheduler.config import ModelConfig
from edge_runtime.scheduler.policy import Decision

log = logging.getLogger(__name__)

ABANDON_RATIO = 1.3
MIN_SAMPLES = 12
PROBE_EVERY = 8  # while a candidate is short of samples; none are probed after that
WINDOW = 64


class PlanRecheck:
    """Abandons the served plan for a candidate measured faster by ``ratio`` (see the module docstring).

    Called under the scheduler's lock (``override`` when deciding, ``observe``
    after each run); holds no lock of its own.
    """

    def __init__(self, model: str, served: str, candidates: Sequence[str], *, ratio: float = ABANDON_RATIO,
                 min_samples: int = MIN_SAMPLES, probe_every: int = PROBE_EVERY) -> None:
        self.model = model
        self.served = served
        self.candidates = [c for c in candidates if c != served]
        self.ratio = ratio
        self.min_samples = min_samples
        self.probe_every = probe_every
        self.abandoned: Counter[tuple[str, str]] = Counter()  # (plan, reason) -> times abandoned
        self._samples: dict[str, deque[float]] = {n: deque(maxlen=WINDOW) for n in (served, *self.candidates)}
        self._decisions = 0
        self._warm_run: str | None = None  # the candidate whose probe owes its second (timed) run
        self._cold: Counter[str] = Counter()  # first runs of probes not yet observed, per plan

    def override(self, decision: Decision) -> Decision:
        """The decision to run instead: the replacement of an abandoned plan, or now and then a probe."""
        self._decisions += 1
        if decision.plan in {plan for plan, _ in self.abandoned} and not decision.explored:
            return Decision(self.served, f"{decision.plan} abandoned for {self.served}")
        if decision.plan == self.served and self._warm_run is not None:
            plan, self._warm_run = self._warm_run, None
            return Decision(plan, f"re-checking {self.served} against {plan}", explored=True)
        if decision.plan == self.served and self._decisions % self.probe_every == 0:
            short = [c for c in self.candidates if len(self._samples[c]) < self.min_samples]
            if short:
                self._warm_run = short[0]
                self._cold[short[0]] += 1
                return Decision(short[0], f"re-checking {self.served} against {short[0]} (waking it, untimed)",
                                explored=True)
        return decision

    def observe(self, plan: str, compute_ms: float, rows: int, ok: bool) -> None:
        """Learn one finished run; may abandon the served plan (logged once, counted)."""
        if plan not in self._samples:
            return
        if self._cold[plan]:  # a probe's first run: timed with the wake-up, so not kept (a failure still is)
            self._cold[plan] -= 1
            if ok:
                return
        self._samples[plan].append(compute_ms / max(1, rows) if ok else float("inf"))
        served = self._samples[self.served]
        if len(served) < self.min_samples:
            return
        failing = statistics.median(served) == float("inf")
        served_ms = float("inf") if failing else _speed(served)
        timed = {c: _speed(self._samples[c]) for c in self.candidates
                 if len(self._samples[c]) >= self.min_samples and statistics.median(self._samples[c]) != float("inf")}
        if not timed:
            return
        best = min(timed, key=timed.get)
        if served_ms > self.ratio * timed[best]:
            reason = "failing" if failing else "slower"
            log.info("model %s: plan %s abandoned for %s (%s: %.3f ms vs %.3f ms per row, lower quartiles of the "
                     "last %d and %d runs; margin %.2fx)", self.model, self.served, best, reason, served_ms,
                     timed[best], len(served), len(self._samples[best]), self.ratio)
            self.abandoned[(self.served, reason)] += 1
            self.candidates = [c for c in self.candidates if c != best]
            self.served = best

    def snapshot(self) -> dict[str, Any]:
        """Served plan now, candidates and their median ms per row (for stats and metadata)."""
        return {"served": self.served, "abandoned": [{"plan": p, "reason": r} for p, r in self.abandoned],
                "ms_per_row": {n: round(_speed(s), 4) for n, s in self._samples.items()
                               if len(s) >= 2 and all(v != float("inf") for v in s)}}


def _speed(samples: Sequence[float]) -> float:
    """A plan's ms per row over its recent runs: their lower quartile, not their median. A candidate
    runs now and then, after idle gaps, and a pool session told to stop spinning after each run
    can take milliseconds to wake then (a one-off script here, a small CNN on 2 cores: 17 of 60
    runs over 1 ms after a 2 ms gap, none back to back; median 0.13 ms), which the served plan,
    running back to back, rarely pays: with medians the re-check read the cpu plan 10-20x slower
    than it is in about a third of runs. The lower quartile reads each side without those wake-ups;
    a plan slower on every run (a throttled device) is slower there too. Probes also go in pairs,
    timing the second run only (``PlanRecheck.override``): one CI run here still read a candidate's
    12 single probes at 0.27 ms a row at their lower quartile against the served plan's 0.06, a plan
    3x slower than that candidate by construction (``tests/planning/test_auto_liar.py``), so more
    than three quarters of those probes paid the idle candidate's wake-up."""
    return statistics.quantiles(samples, n=4, method="inclusive")[0] if len(samples) > 1 else samples[0]


def plan_recheck(model: str, config: ModelConfig, plans: Mapping[str, Any], default_plan: str) -> PlanRecheck | None:
    """A re-check of ``default_plan`` against the model's other plans, where it applies: ``fixed`` on
    ``auto`` (the default configuration) or ``cost``, with more than one plan; None otherwise."""
    scheduler = config.scheduler
    if len(plans) < 2 or default_plan not in plans:
        return None
    if scheduler.policy == "threshold" or (scheduler.policy == "fixed" and scheduler.plan != "auto"):
        return None
    candidates = [name for name in plans if name != default_plan and not _is_cloud(plans[name])]
    return PlanRecheck(model, default_plan, candidates) if candidates else None


def candidate_plans(runtime: Any, model: Any, options: Any) -> tuple[dict[str, Any], list[Any]]:
    """(plan name -> compiled plan, what to close with them) for the re-check of a model ``auto`` placed: the
    candidates its race measured within ``plan_race.CANDIDATE_MARGIN`` of the winner, and ``cpu``
    when the winner is not on the host alone. Empty for a model placed otherwise; a candidate
    that fails to compile is left out (logged)."""
    from edge_runtime.scheduler.plans import model_plan

    decision = getattr(model.report, "decision", None)
    if decision is None:
        return {}, []
    names = [entry.name for entry in decision.close_candidates()]
    if model.backend != "cpu" and "cpu" not in names:
        names.append("cpu")  # ORT maps no driver and is always there: the safe side to fall to
    plans: dict[str, Any] = {}
    owned: list[Any] = []
    for name in names:
        if name == model.backend:
            continue
        try:
            if name == "cpu":
                loaded = runtime.load(model.path, name=model.name, backend="cpu", options=options)
                plans[name] = model_plan(name, loaded)
            else:  # the plan's own layout, not auto's measured pick again
                loaded = runtime.plans(model.path, names=[name], options=options, input_shapes=decision.shapes)[name]
                plans[name] = loaded
            owned.append(loaded)
        except Exception as exc:  # a candidate is an option, not a requirement
            log.info("model %s: candidate plan %s not compiled (%s: %s)", model.name, name, type(exc).__name__, exc)
    return plans, owned


def _is_cloud(plan: Any) -> bool:
    from edge_runtime.scheduler.plans import plan_device

    return plan_device(plan) == "cloud"


