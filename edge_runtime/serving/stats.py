"""Per model version counters: the source of ``/v2/models/{m}/stats`` and of ``/metrics``.

Shapes follow Triton's statistics extension. Counting rules:

* ``inference_count`` counts inferences: a request of N rows of a dynamic
  batch dimension counts N (Triton's rule), otherwise 1.
* ``execution_count`` counts model executions: a batch the scheduler merged
  from several requests runs once, so each request adds rows / batch rows.
* durations are nanoseconds here, microseconds in ``/metrics``.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_runtime.scheduler import InferenceResult


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += max(0, int(ns))

    def to_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class VersionStats:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    inference_count: int = 0
    last_inference_ms: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # reason -> count
    plans: Counter[str] = field(default_factory=Counter)  # plan name -> requests
    fallbacks: Counter[tuple[str, str]] = field(default_factory=Counter)  # (backend, reason) -> requests
    # Batch rows -> [rows answered from batches of that size, their share of compute ns]. Integers on the
    # request path (a Fraction per request cost microseconds there); executions are worked out when read.
    batches: dict[int, list[int]] = field(default_factory=dict)

    @property
    def executions(self) -> Fraction:
        return sum((Fraction(rows, size) for size, (rows, _) in self.batches.items()), Fraction(0))

    @property
    def execution_count(self) -> int:
        return round(self.executions)

    @property
    def request_ns(self) -> int:
        return self.success.ns + self.fail.ns


def _zero() -> dict[str, int]:
    return Duration().to_dict()


class InferenceStats:
    """Accumulates what the server saw, per ``(model, version)``; cheap, event-loop only."""

    def __init__(self) -> None:
        self._stats: dict[tuple[str, str], VersionStats] = {}

    def of(self, model: str, version: str) -> VersionStats:
        return self._stats.setdefault((model, version), VersionStats())

    def items(self) -> list[tuple[tuple[str, str], VersionStats]]:
        return sorted(self._stats.items())

    def record_success(self, model: str, version: str, result: InferenceResult, rows: int, request_ns: int,
                       fallback: tuple[str, str] | None = None) -> None:
        """Count one answered request; ``fallback`` is (failed backend, reason) when a stage re-ran on cpu."""
        stats = self.of(model, version)
        stats.success.add(request_ns)
        stats.queue.add(int(result.queue_ms * 1e6))
        stats.compute_infer.add(int(result.compute_ms * 1e6))
        stats.inference_count += rows
        batch_rows = max(result.batch_size, rows, 1)
        entry = stats.batches.setdefault(batch_rows, [0, 0])
        entry[0] += rows  # this request's share of the batch's one execution: rows / batch_rows
        entry[1] += int(result.compute_ms * 1e6 * rows / batch_rows)
        stats.last_inference_ms = int(time.time() * 1000)
        stats.plans[result.plan] += 1
        if fallback is not None:
            stats.fallbacks[fallback] += 1

    def record_failure(self, model: str, version: str, reason: str, request_ns: int) -> None:
        stats = self.of(model, version)
        stats.fail.add(request_ns)
        stats.failures[reason] += 1
        stats.last_inference_ms = int(time.time() * 1000)

    def triton(self, model: str, version: str) -> dict[str, Any]:
        """One entry of Triton's ``model_stats`` list."""
        stats = self.of(model, version)
        return {
            "name": model,
            "version": version,
            "last_inference": stats.last_inference_ms,
            "inference_count": stats.inference_count,
            "execution_count": stats.execution_count,
            "inference_stats": {
                "success": stats.success.to_dict(),
                "fail": stats.fail.to_dict(),
                "queue": stats.queue.to_dict(),
                # Tensors are decoded and encoded by the server, outside the model's compute.
                "compute_input": _zero(),
                "compute_infer": stats.compute_infer.to_dict(),
                "compute_output": _zero(),
                "cache_hit": _zero(),
                "cache_miss": _zero(),
            },
            "batch_stats": [
                {"batch_size": size, "compute_input": _zero(), "compute_output": _zero(),
                 "compute_infer": {"count": round(Fraction(rows, size)), "ns": ns}}
                for size, (rows, ns) in sorted(stats.batches.items())
            ],
            "memory_usage": [],
        }
