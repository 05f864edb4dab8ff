"""Circuit breaker for the cloud peer: stop calling after repeated failures, probe before resuming.

States::

    closed ──(failure_threshold consecutive failures)──► open
    open ──(reset_ms elapsed; the next caller is the probe)──► half_open
    half_open ──(probe succeeds)──► closed      half_open ──(probe fails)──► open

While open (and while a half-open probe is in flight) ``allow()`` says no, so
callers stay local. Thread-safe: plans call it from worker threads.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger(__name__)

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(frozen=True)
class BreakerSnapshot:
    """The breaker's state and counters, for metrics and results."""

    state: str
    consecutive_failures: int
    opened: int  # times it went (back) to open
    closed_again: int  # times a probe closed it
    rejected: int  # calls refused while open


class CircuitBreaker:
    """Counts consecutive failures; see the module docstring. ``clock`` returns seconds (tests inject one)."""

    def __init__(self, failure_threshold: int = 3, reset_ms: float = 5000.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold}")
        self.failure_threshold = failure_threshold
        self.reset_s = reset_ms / 1e3
        self._clock = clock
        self._lock = threading.Lock()
        self._state = CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probe_out = False
        self._opened = 0
        self._closed_again = 0
        self._rejected = 0

    @property
    def state(self) -> str:
        with self._lock:
            return self._current()

    def _current(self) -> str:
        if self._state == OPEN and self._clock() - self._opened_at >= self.reset_s:
            self._state = HALF_OPEN
            self._probe_out = False
        return self._state

    def allow(self) -> bool:
        """Whether a cloud call may go now. In half-open only one caller (the probe) gets True."""
        with self._lock:
            state = self._current()
            if state == CLOSED:
                return True
            if state == HALF_OPEN and not self._probe_out:
                self._probe_out = True
                log.info("cloud breaker half-open: probing the peer")
                return True
            self._rejected += 1
            return False

    def record_success(self) -> None:
        with self._lock:
            if self._state != CLOSED:
                log.info("cloud breaker closed: the peer answered")
                self._closed_again += 1
            self._state = CLOSED
            self._failures = 0
            self._probe_out = False

    def record_failure(self) -> None:
        with self._lock:
            self._failures += 1
            if self._state == HALF_OPEN or (self._state == CLOSED and self._failures >= self.failure_threshold):
                log.warning("cloud breaker open after %d consecutive failure(s); staying local for %.1f s",
                            self._failures, self.reset_s)
                self._state = OPEN
                self._opened += 1
                self._opened_at = self._clock()
                self._probe_out = False

    def snapshot(self) -> BreakerSnapshot:
        with self._lock:
            return BreakerSnapshot(self._current(), self._failures, self._opened, self._closed_again, self._rejected)
