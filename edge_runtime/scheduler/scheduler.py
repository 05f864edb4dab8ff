"""``ModelScheduler``: one model's bounded priority queue, plan choice and worker.

Requests are validated on arrival, queued by priority (bounded: overflow is an
immediate ``QueueFullError``), dropped with ``DeadlineExceededError`` once
their deadline passes (never run late), and run by one worker per model in a
thread so the event loop never blocks. Every result says which plan and
backends ran it and how long it queued and computed.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import Counter
from concurrent.futures import Executor
from typing import Any, Callable, Mapping

from backends.base import TensorSpec
from edge_runtime.errors import DeadlineExceededError, EdgeRuntimeError, QueueFullError
from edge_runtime.scheduler.config import ModelConfig
from edge_runtime.scheduler.plans import Plan
from edge_runtime.scheduler.request import InferenceResult, QueuedRequest
from edge_runtime.validation import validate_feeds

log = logging.getLogger(__name__)

PlanChooser = Callable[[Mapping[str, Plan], QueuedRequest], str]


class ModelScheduler:
    """Queue + worker for one model. Use ``async with`` or ``start()`` / ``close()``."""

    def __init__(self, name: str, inputs: list[TensorSpec], plans: Mapping[str, Plan],
                 config: ModelConfig, executor: Executor | None = None,
                 choose_plan: PlanChooser | None = None) -> None:
        if not plans:
            raise ValueError("a scheduler needs at least one plan")
        self.name = name
        self.inputs = list(inputs)
        self.plans = dict(plans)
        self.config = config
        self._executor = executor
        self._choose = choose_plan or _first_plan
        self._heap: list[QueuedRequest] = []
        self._wakeup = asyncio.Event()
        self._worker: asyncio.Task | None = None
        self._closing = False
        self.in_flight = 0
        self.counters: Counter[str] = Counter()

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._work(), name=f"scheduler:{self.name}")

    async def close(self, drain_timeout_s: float = 10.0) -> None:
        """Stop accepting; finish queued and running requests within the grace period."""
        self._closing = True
        deadline = time.monotonic() + drain_timeout_s
        while (self._heap or self.in_flight) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for entry in self._heap:
            if not entry.future.done():
                entry.future.set_exception(EdgeRuntimeError(f"model {self.name!r} is shutting down"))
        self._heap.clear()
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None

    async def __aenter__(self) -> "ModelScheduler":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- requests ----------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self._heap)

    async def infer(self, feeds: Mapping[str, Any], *, priority: int = 0, timeout_ms: float | None = None,
                    request_id: str | None = None, plan: str | None = None) -> InferenceResult:
        """Queue one request and wait for its result.

        Raises InvalidInputError (bad feeds, before queueing), QueueFullError
        (queue at ``max_queue_size``), DeadlineExceededError (``timeout_ms``, or
        the model's ``default_timeout_ms``, passed first), BackendError.
        """
        if self._closing:
            raise EdgeRuntimeError(f"model {self.name!r} is shutting down")
        if plan is not None and plan not in self.plans:
            raise EdgeRuntimeError(f"model {self.name!r} has no plan {plan!r}; plans: {sorted(self.plans)}")
        arrays = validate_feeds(self.inputs, feeds)
        if len(self._heap) >= self.config.queue.max_queue_size:
            self.counters["rejected_queue_full"] += 1
            raise QueueFullError(f"model {self.name!r}: queue full ({self.config.queue.max_queue_size} waiting)")
        timeout_ms = timeout_ms if timeout_ms else (self.config.queue.default_timeout_ms or None)
        deadline = time.monotonic() + timeout_ms / 1e3 if timeout_ms else None
        future = asyncio.get_running_loop().create_future()
        entry = QueuedRequest(priority=priority, feeds=arrays, future=future, deadline=deadline,
                              request_id=request_id, plan_hint=plan)
        heapq.heappush(self._heap, entry)
        self._wakeup.set()
        if self._worker is None:
            await self.start()
        try:
            if deadline is None:
                return await asyncio.shield(future)
            return await asyncio.wait_for(asyncio.shield(future), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            self.counters["deadline_exceeded"] += 1
            if not future.done():
                future.cancel()  # the worker skips it; a running one finishes unseen
            raise DeadlineExceededError(
                f"model {self.name!r}: request {request_id or ''} exceeded its {timeout_ms:g} ms deadline".replace("  ", " "))
        except asyncio.CancelledError:
            if not future.done():
                future.cancel()
            raise

    # -- worker ------------------------------------------------------------------
    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._heap:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            entry = heapq.heappop(self._heap)
            if entry.abandoned:
                continue
            if entry.expired():
                self.counters["deadline_exceeded"] += 1
                entry.future.set_exception(DeadlineExceededError(
                    f"model {self.name!r}: deadline passed while queued; not run"))
                continue
            plan_name = entry.plan_hint or self._choose(self.plans, entry)
            plan = self.plans[plan_name]
            self.counters[f"plan:{plan_name}"] += 1
            started = time.monotonic()
            self.in_flight += 1
            try:
                outputs = await loop.run_in_executor(self._executor, plan.run, entry.feeds)
            except Exception as exc:  # hand every failure to its caller, keep serving others
                self.counters["failures"] += 1
                if not entry.future.done():
                    entry.future.set_exception(exc)
                continue
            finally:
                self.in_flight -= 1
            done = time.monotonic()
            if not entry.future.done():
                entry.future.set_result(InferenceResult(
                    outputs=outputs, plan=plan_name, backends=plan.backends,
                    queue_ms=(started - entry.enqueued_at) * 1e3, compute_ms=(done - started) * 1e3,
                    request_id=entry.request_id))
            self.counters["success"] += 1

    def stats(self) -> dict[str, Any]:
        return {"pending": self.pending, "in_flight": self.in_flight, **dict(self.counters)}


def _first_plan(plans: Mapping[str, Plan], entry: QueuedRequest) -> str:
    return next(iter(plans))


def model_plans(model: Any) -> dict[str, Plan]:
    """The single plan of a loaded ``Model``: its backend, running without re-validation."""
    from edge_runtime.scheduler.plans import CallablePlan

    return {model.backend: CallablePlan(model.backend, tuple(model.backend_nodes), model._run_validated)}


