"""``RequestQueue``: one model's bounded priority queue of waiting requests.

Highest ``priority`` first, then arrival order. Bounded: a push beyond
``max_size`` (after dropping entries nobody waits for) raises
``QueueFullError`` at once, so memory stays bounded under any load. Entries
whose deadline passed are answered with ``DeadlineExceededError`` as they are
met, and never handed out to run.
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Callable

from edge_runtime.errors import DeadlineExceededError, EdgeRuntimeError, QueueFullError
from edge_runtime.scheduler.request import QueuedRequest


class RequestQueue:
    """Priority heap with a bound; counts ``rejected_queue_full`` and ``deadline_exceeded`` in ``counters``."""

    def __init__(self, model: str, max_size: int, counters: Counter) -> None:
        self.model = model
        self.max_size = max_size
        self.counters = counters
        self._heap: list[QueuedRequest] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, entry: QueuedRequest) -> None:
        """Queue ``entry``; raises QueueFullError when ``max_size`` live entries wait already."""
        if len(self._heap) >= self.max_size:
            self._purge_dead()
        if len(self._heap) >= self.max_size:
            self.counters["rejected_queue_full"] += 1
            raise QueueFullError(f"model {self.model!r}: queue full ({self.max_size} waiting)")
        heapq.heappush(self._heap, entry)

    def head(self, dead: list[QueuedRequest] | None = None) -> QueuedRequest | None:
        """The highest-priority live entry (left queued), after answering the dead ones in front of it.

        Off the event loop pass ``dead``: the dead entries are removed and collected there, for
        ``expire`` on the loop (their futures belong to it).
        """
        while self._heap and self._heap[0].dead:
            entry = heapq.heappop(self._heap)
            if dead is None:
                self._expire(entry)
            else:
                dead.append(entry)
        return self._heap[0] if self._heap else None

    def expire(self, entries: list[QueuedRequest]) -> None:
        """On the loop: answer entries ``head`` collected off it (deadline passed while queued)."""
        for entry in entries:
            self._expire(entry)

    def live(self, accept: Callable[[QueuedRequest], bool]) -> list[QueuedRequest]:
        """Live entries that ``accept`` takes, in priority order (left queued)."""
        return [entry for entry in sorted(self._heap) if not entry.dead and accept(entry)]

    def rows_waiting(self) -> int:
        return sum(entry.rows or 1 for entry in self._heap)

    def take(self, entries: list[QueuedRequest]) -> None:
        """Remove ``entries`` (about to run) from the queue."""
        taken = {id(entry) for entry in entries}
        self._heap = [entry for entry in self._heap if id(entry) not in taken]
        heapq.heapify(self._heap)

    def fail_all(self, error: EdgeRuntimeError) -> None:
        """Answer every waiting entry with ``error`` and empty the queue (shutdown)."""
        for entry in self._heap:
            if not entry.future.done():
                entry.future.set_exception(error)
        self._heap.clear()

    def _purge_dead(self) -> None:
        live = []
        for entry in self._heap:
            if entry.dead:
                self._expire(entry)
            else:
                live.append(entry)
        heapq.heapify(live)
        self._heap = live

    def _expire(self, entry: QueuedRequest) -> None:
        if not entry.future.done():
            self.counters["deadline_exceeded"] += 1
            entry.future.set_exception(DeadlineExceededError(
                f"model {self.model!r}: deadline passed while queued; not run"))
