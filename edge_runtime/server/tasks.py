"""Async inference tasks: submit now, poll later (apps on a phone that sleep between calls).

A task is ``pending`` until its inference finishes, then ``succeeded``, ``failed``
or ``cancelled``. ``DELETE`` cancels a pending task (it stays visible as
``cancelled``) and forgets a finished one. Finished tasks are kept for ``task_ttl_s`` seconds and are
bounded in number (``max_tasks``) and in result bytes (``max_task_bytes``):
when a bound is hit the oldest finished tasks are evicted first. Pending tasks
are never evicted; when ``max_tasks`` are pending a new submission is refused
with ``QueueFullError`` (429 + Retry-After). A result larger than
``max_task_bytes`` on its own is not kept: the task fails saying so.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from edge_runtime.errors import QueueFullError
from edge_runtime.protocol.codec import EncodedResponse
from edge_runtime.server.errors import TaskNotFoundError, mapping_of, public_message

log = logging.getLogger(__name__)

PENDING, SUCCEEDED, FAILED, CANCELLED = "pending", "succeeded", "failed", "cancelled"


@dataclass
class Task:
    id: str
    model: str
    version: str
    created_s: float = field(default_factory=time.time)
    status: str = PENDING
    finished_s: float | None = None
    finished_at: float | None = None  # time.monotonic(), for the TTL
    response: EncodedResponse | None = None
    error: str | None = None
    error_status: int | None = None
    runner: asyncio.Task | None = field(default=None, repr=False)

    @property
    def size_bytes(self) -> int:
        return len(self.response.body) if self.response is not None else 0

    def to_dict(self) -> dict[str, Any]:
        document: dict[str, Any] = {"id": self.id, "status": self.status, "model_name": self.model,
                                    "model_version": self.version, "created": self.created_s,
                                    "result_url": f"/v2/tasks/{self.id}/result"}
        if self.finished_s is not None:
            document["finished"] = self.finished_s
        if self.error is not None:
            document["error"] = self.error
            document["error_status"] = self.error_status
        return document


class TaskStore:
    """Holds async tasks in submission order; all methods run on the event loop."""

    def __init__(self, ttl_s: float, max_tasks: int, max_bytes: int, overload_status: int = 429) -> None:
        self.ttl_s = ttl_s
        self.max_tasks = max_tasks
        self.max_bytes = max_bytes
        self._overload_status = overload_status
        self._tasks: OrderedDict[str, Task] = OrderedDict()
        self._bytes = 0

    def submit(self, model: str, version: str, work: Callable[[], Awaitable[EncodedResponse]]) -> Task:
        """Start ``work`` in the background as a new task; QueueFullError when full of pending tasks."""
        self._expire()
        if len(self._tasks) >= self.max_tasks and not self._evict_oldest_finished():
            raise QueueFullError(f"async tasks: {self.max_tasks} are pending; poll or cancel some first")
        task = Task(uuid.uuid4().hex, model, version)
        self._tasks[task.id] = task
        task.runner = asyncio.get_running_loop().create_task(self._run(task, work), name=f"task:{task.id}")
        return task

    def get(self, task_id: str) -> Task:
        self._expire()
        task = self._tasks.get(task_id)
        if task is None:
            raise TaskNotFoundError(f"no task {task_id!r} (unknown, removed, or expired after {self.ttl_s:g} s)")
        return task

    async def cancel(self, task_id: str) -> Task:
        """Cancel a pending task (kept, as ``cancelled``, for the TTL) or forget a finished one."""
        task = self.get(task_id)
        if task.status == PENDING and task.runner is not None:
            task.runner.cancel()
            await asyncio.gather(task.runner, return_exceptions=True)
        else:
            self._remove(task)
        return task

    def counts(self) -> dict[str, int]:
        counts = {PENDING: 0, SUCCEEDED: 0, FAILED: 0, CANCELLED: 0}
        for task in self._tasks.values():
            counts[task.status] += 1
        return counts

    @property
    def bytes_kept(self) -> int:
        return self._bytes

    async def drain(self, timeout_s: float) -> None:
        """Let pending tasks finish for up to ``timeout_s``, then cancel the rest (shutdown)."""
        runners = [t.runner for t in self._tasks.values() if t.status == PENDING and t.runner is not None]
        if not runners:
            return
        done, still = await asyncio.wait(runners, timeout=timeout_s)
        for runner in still:
            runner.cancel()
        if still:
            log.warning("shutdown: cancelled %d async task(s) still pending after %.1f s", len(still), timeout_s)
            await asyncio.gather(*still, return_exceptions=True)

    async def _run(self, task: Task, work: Callable[[], Awaitable[EncodedResponse]]) -> None:
        try:
            response = await work()
        except asyncio.CancelledError:
            self._finish(task, CANCELLED, error="the task was cancelled")
            raise
        except Exception as exc:  # the task records every failure; the server keeps going
            mapping = mapping_of(exc, self._overload_status)
            if mapping.status == 500:
                log.exception("async task %s failed", task.id)
            self._finish(task, FAILED, error=public_message(exc), error_status=mapping.status)
            return
        if len(response.body) > self.max_bytes:
            self._finish(task, FAILED, error_status=507, error=(
                f"the result is {len(response.body)} bytes, more than max_task_bytes ({self.max_bytes}); "
                "request fewer outputs or call synchronously"))
            return
        self._finish(task, SUCCEEDED, response=response)
        while self._bytes > self.max_bytes and self._evict_oldest_finished(keep=task):
            pass

    def _finish(self, task: Task, state: str, *, response: EncodedResponse | None = None,
                error: str | None = None, error_status: int | None = None) -> None:
        task.status = state
        task.finished_s = time.time()
        task.finished_at = time.monotonic()
        task.response = response
        task.error = error
        task.error_status = error_status
        if task.id in self._tasks:
            self._bytes += task.size_bytes

    def _expire(self) -> None:
        now = time.monotonic()
        for task in [t for t in self._tasks.values() if t.finished_at is not None and now - t.finished_at > self.ttl_s]:
            self._remove(task)

    def _evict_oldest_finished(self, keep: Task | None = None) -> bool:
        for task in self._tasks.values():
            if task.status != PENDING and task is not keep:
                log.info("async task %s evicted (bounds: %d tasks, %d bytes)", task.id, self.max_tasks, self.max_bytes)
                self._remove(task)
                return True
        return False

    def _remove(self, task: Task) -> None:
        if self._tasks.pop(task.id, None) is not None:
            self._bytes -= task.size_bytes
