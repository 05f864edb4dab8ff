"""How far a converted model drifts from its fp32 original, and how fast each runs per plan.

``accuracy_report`` runs both models on the same samples and compares every
output: max and mean absolute error, the error relative to the fp32 output's
range, and for classifier-shaped outputs (``[batch, classes]``) the share of
rows whose arg-max agrees. ``speed_report`` times both models on each plan,
interleaved in rounds (best of each), so machine drift hits both alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

Runner = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class OutputDrift:
    """One output's error over every sample; ``top1_agreement`` None when not classifier-shaped."""

    name: str
    max_abs: float
    mean_abs: float
    max_rel_range: float  # max_abs / (max - min of the fp32 output)
    top1_agreement: float | None
    rows: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "max_abs": self.max_abs, "mean_abs": self.mean_abs,
                "max_rel_range": self.max_rel_range, "top1_agreement": self.top1_agreement, "rows": self.rows}


def accuracy_report(reference: Runner, candidate: Runner, samples: Sequence[Mapping[str, np.ndarray]]) -> list[OutputDrift]:
    """Per-output drift of ``candidate`` against ``reference`` over ``samples`` (both called on each)."""
    collected: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for sample in samples:
        want, got = reference(sample), candidate(sample)
        for name, value in want.items():
            pair = collected.setdefault(name, ([], []))
            pair[0].append(np.asarray(value))
            pair[1].append(np.asarray(got[name]))
    # Samples are stacked along the first (batch) axis; scalars become one row each.
    return [_drift(name, np.concatenate([np.atleast_1d(w) for w in want]),
                   np.concatenate([np.atleast_1d(g) for g in got]))
            for name, (want, got) in collected.items()]


def _drift(name: str, want: np.ndarray, got: np.ndarray) -> OutputDrift:
    if want.dtype.kind not in "fc":
        equal = float(np.mean(want == got)) if want.size else 1.0
        return OutputDrift(name, 0.0 if equal == 1.0 else float("nan"), 1.0 - equal, 0.0, None, len(want))
    want64, got64 = want.astype(np.float64), got.astype(np.float64)
    error = np.abs(want64 - got64)
    spread = float(want64.max() - want64.min()) if want64.size else 0.0
    max_abs = float(error.max()) if error.size else 0.0
    top1 = None
    if want.ndim == 2 and want.shape[1] > 1:
        top1 = float(np.mean(want64.argmax(axis=1) == got64.argmax(axis=1)))
    return OutputDrift(name, round(max_abs, 8), round(float(error.mean()) if error.size else 0.0, 8),
                       round(max_abs / spread, 6) if spread else 0.0, top1, len(want))


@dataclass(frozen=True)
class PlanSpeed:
    """Best-of-rounds latency of the reference and the converted model on one plan."""

    plan: str
    reference_ms: float
    candidate_ms: float

    @property
    def speedup(self) -> float:
        return self.reference_ms / self.candidate_ms if self.candidate_ms else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan, "reference_ms": round(self.reference_ms, 4),
                "candidate_ms": round(self.candidate_ms, 4), "speedup": round(self.speedup, 3)}


def time_interleaved(runners: Mapping[str, Callable[[], object]], rounds: int = 5,
                     runs_per_round: int = 10) -> dict[str, float]:
    """Best-of-rounds median ms of each runner, the runners taking turns in every round."""
    best = {name: float("inf") for name in runners}
    for run in runners.values():
        run()  # warm-up: first-run allocations are not the steady state
    for _ in range(max(1, rounds)):
        for name, run in runners.items():
            samples = []
            for _ in range(max(1, runs_per_round)):
                start = time.perf_counter()
                run()
                samples.append(time.perf_counter() - start)
            best[name] = min(best[name], float(np.median(samples)) * 1e3)
    return best


def speed_report(pairs: Mapping[str, tuple[Runner, Runner]], sample: Mapping[str, np.ndarray],
                 rounds: int = 5, runs_per_round: int = 10) -> list[PlanSpeed]:
    """For each plan name -> (reference, candidate) runners, their interleaved best-of-rounds latency."""
    speeds = []
    for plan, (reference, candidate) in pairs.items():
        best = time_interleaved({"reference": lambda r=reference: r(sample),
                                 "candidate": lambda c=candidate: c(sample)}, rounds, runs_per_round)
        speeds.append(PlanSpeed(plan, best["reference"], best["candidate"]))
    return speeds
