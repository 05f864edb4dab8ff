"""A queued request, the result handed back to the caller, and why a plan failed on the way."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Hashable

import numpy as np

_sequence = itertools.count()


@dataclass(frozen=True)
class InferenceResult:
    """Outputs plus where and how long: every result carries its plan and timings."""

    outputs: dict[str, np.ndarray]
    plan: str
    backends: tuple[str, ...]
    queue_ms: float
    compute_ms: float
    batch_size: int = 1
    request_id: str | None = None
    fallback: str | None = None  # why a plan's stage re-ran elsewhere, if it did
    # Set from the failed plan's error when the request re-ran on cpu (a cloud call's error says both):
    retried: bool = False  # the failed call had been re-tried (after failures that never reached the peer)
    ran_twice: bool = False  # the failed plan may have run it too (sent to the peer, answer lost)
    fallback_labels: tuple[str, str] | None = None  # (failed backend, short reason) of a stage fallback

    def timing(self) -> dict[str, Any]:
        return {"plan": self.plan, "backends": list(self.backends), "queue_ms": round(self.queue_ms, 3),
                "compute_ms": round(self.compute_ms, 3), "batch_size": self.batch_size,
                "fallback": self.fallback, "retried": self.retried, "ran_twice": self.ran_twice}


@dataclass(frozen=True)
class PlanFailure:
    """Why a plan's run failed and re-ran on cpu. A cloud call's error (``CloudCallError``) says
    whether it had been re-tried (``attempts`` > 1) and whether the peer may have run it (``maybe_ran``)."""

    reason: str
    retried: bool = False
    maybe_ran: bool = False
    labels: tuple[str, str] | None = None  # (backend, reason) when a stage inside the plan fell back

    @classmethod
    def of(cls, plan: str, exc: BaseException) -> "PlanFailure":
        return cls(f"plan {plan!r} failed: {exc}", retried=getattr(exc, "attempts", 1) > 1,
                   maybe_ran=bool(getattr(exc, "maybe_ran", False)))


@dataclass(order=True)
class QueuedRequest:
    """Heap entry: higher ``priority`` first, then arrival order."""

    sort_key: tuple[int, int] = field(init=False, repr=False)
    priority: int = field(compare=False)
    feeds: dict[str, np.ndarray] = field(compare=False)
    future: asyncio.Future = field(compare=False)
    deadline: float | None = field(compare=False, default=None)  # time.monotonic() seconds
    request_id: str | None = field(compare=False, default=None)
    enqueued_at: float = field(compare=False, default_factory=time.monotonic)
    plan_hint: str | None = field(compare=False, default=None)
    rows: int | None = field(compare=False, default=None)  # dim 0 shared by all inputs; None = runs alone
    batch_key: Hashable = field(compare=False, default=None)  # equal keys may share a batch

    def __post_init__(self) -> None:
        self.sort_key = (-self.priority, next(_sequence))

    def expired(self, now: float | None = None) -> bool:
        return self.deadline is not None and (now or time.monotonic()) >= self.deadline

    @property
    def dead(self) -> bool:
        """Nobody will take this entry's result: abandoned, or past its deadline."""
        return self.abandoned or self.expired()

    @property
    def abandoned(self) -> bool:
        """The caller stopped waiting (deadline passed, or the caller was cancelled)."""
        return self.future.done()
