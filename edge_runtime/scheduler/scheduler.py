"""``ModelScheduler``: one model's bounded priority queue, plan choice, batching and dispatch.

Requests are validated on arrival and queued by priority (bounded: overflow is
an immediate ``QueueFullError``). Dispatch is event-driven: on every arrival,
finished run, freed device slot and batch timer, ``_pump`` takes the
highest-priority live request, asks the policy for a plan under the current
load, gathers compatible requests into a batch (``batching.py``) once the
batch is ready, takes a slot on that plan's device worker and hands the batch
to the worker's thread, so the event loop never blocks. (No dispatcher task:
each hop through the loop costs tens of microseconds on a small core.) A
request whose deadline passes while queued is answered with
``DeadlineExceededError`` and never run. A plan that fails with BackendError
is re-run on the cpu plan (counted as a fallback; the result's ``retried`` and
``ran_twice`` come from the failed plan's error, so a cloud call that may have
run on the peer is never re-run silently). Every result says which plan and
backends ran it, how long it queued and computed, and the batch size.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from concurrent.futures import Executor
from typing import Any, Callable, Mapping, Sequence

from backends.base import TensorSpec
from edge_runtime.errors import BackendError, DeadlineExceededError, EdgeRuntimeError
from edge_runtime.load_monitor import LoadMonitor, LoadReading
from edge_runtime.scheduler.batching import BatchSizer, batch_key, has_batch_dim, join_feeds, request_rows, split_outputs
from edge_runtime.scheduler.config import ModelConfig
from edge_runtime.scheduler.plans import Plan, plan_device, plan_kind
from edge_runtime.scheduler.policy import Decision, DecisionContext, Policy, make_policy
from edge_runtime.scheduler.queue import RequestQueue
from edge_runtime.scheduler.request import InferenceResult, PlanFailure, QueuedRequest
from edge_runtime.scheduler.workers import DeviceWorker, DeviceWorkers
from edge_runtime.validation import validate_feeds

log = logging.getLogger(__name__)

PlanChooser = Callable[[Mapping[str, Plan], QueuedRequest], str]


class ModelScheduler:
    """Queue + dispatcher for one model. Use ``async with`` or ``start()`` / ``close()``.

    ``choose_plan`` (legacy hook) overrides the policy; otherwise ``policy`` or
    the one ``config.scheduler`` names is used. ``monitor`` supplies load
    readings (none: load unknown). ``workers`` are the device workers to share
    with other models (default: private ones on ``executor``). ``outputs``
    lets batching check that every output has a batch dimension; without it
    only the inputs are checked. ``default_plan`` is what ``plan = "auto"`` means.
    ``owned`` objects (models compiled for extra plans) are closed by ``close()``.
    """

    def __init__(self, name: str, inputs: list[TensorSpec], plans: Mapping[str, Plan],
                 config: ModelConfig, executor: Executor | None = None,
                 choose_plan: PlanChooser | None = None, *, outputs: list[TensorSpec] | None = None,
                 monitor: LoadMonitor | None = None, workers: DeviceWorkers | None = None,
                 policy: Policy | None = None, default_plan: str | None = None,
                 owned: Sequence[Any] = ()) -> None:
        if not plans:
            raise ValueError("a scheduler needs at least one plan")
        self.name = name
        self.inputs = list(inputs)
        self.plans = dict(plans)
        self.config = config
        self.policy = policy or make_policy(config.scheduler, self.plans, default_plan)
        self._chooser = choose_plan
        self._monitor = monitor
        self._own_workers = workers is None
        self._workers = workers or DeviceWorkers(executor)
        self._devices = {plan_name: plan_device(plan) for plan_name, plan in self.plans.items()}
        cpu_plans = [n for n, p in self.plans.items() if plan_kind(n, p) == "cpu"]
        self._cpu_plan = "cpu" if "cpu" in self.plans else (cpu_plans[0] if cpu_plans else None)
        self.batching = config.batching.enabled and has_batch_dim(self.inputs, outputs or [])
        if config.batching.enabled and not self.batching:
            log.info("model %s: batching configured but some input/output has a fixed dim 0; batching off", name)
        self._sizer = BatchSizer(config.batching)
        self._delay_s = config.batching.max_queue_delay_us / 1e6
        self.counters: Counter[str] = Counter()
        self._queue = RequestQueue(name, config.queue.max_queue_size, self.counters)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None  # wakes _pump when a batch's delay ends
        self._waiting_for: set[str] = set()  # devices whose next free slot re-runs _pump
        self._closing = False
        self.in_flight = 0
        self.last_decision: Decision | None = None
        self._owned = list(owned)

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        """Accept requests (``infer`` also starts the scheduler on first use)."""
        self._loop = asyncio.get_running_loop()

    async def close(self, drain_timeout_s: float = 10.0) -> None:
        """Stop accepting; finish queued and running requests within the grace period."""
        self._closing = True
        if self._loop is not None:
            self._pump()
        deadline = time.monotonic() + drain_timeout_s
        while (len(self._queue) or self.in_flight) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._queue.fail_all(EdgeRuntimeError(f"model {self.name!r} is shutting down"))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._own_workers:
            self._workers.close()
        self.discard()

    def discard(self) -> None:
        """Close the models this scheduler owns (``close`` drains first; this alone suits one never started)."""
        for resource in self._owned:
            resource.close()
        self._owned.clear()

    async def __aenter__(self) -> "ModelScheduler":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- requests ----------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self._queue)

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
        timeout_ms = timeout_ms if timeout_ms else (self.config.queue.default_timeout_ms or None)
        deadline = time.monotonic() + timeout_ms / 1e3 if timeout_ms else None
        future = asyncio.get_running_loop().create_future()
        entry = QueuedRequest(priority=priority, feeds=arrays, future=future, deadline=deadline,
                              request_id=request_id, plan_hint=plan, rows=request_rows(arrays),
                              batch_key=batch_key(arrays))
        self._queue.push(entry)  # QueueFullError when full
        if self._loop is None:
            await self.start()
        self._pump()
        try:
            if deadline is None:
                return await future
            # wait_for cancels the future on timeout: the pump skips it; a running one finishes unseen.
            return await asyncio.wait_for(future, max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            self.counters["deadline_exceeded"] += 1
            raise DeadlineExceededError(" ".join(
                f"model {self.name!r}: request {request_id or ''} exceeded its {timeout_ms:g} ms deadline".split()))
        except asyncio.CancelledError:
            if not future.done():
                future.cancel()
            raise

    # -- dispatch ------------------------------------------------------------------
    def _reading(self) -> LoadReading:
        return self._monitor.reading if self._monitor is not None else LoadReading()

    def _decide(self, head: QueuedRequest) -> Decision:
        if head.plan_hint is not None:
            return Decision(head.plan_hint, "requested by the caller")
        if self._chooser is not None:
            return Decision(self._chooser(self.plans, head), "choose_plan hook")
        rows = min(self._queue.rows_waiting(), self._sizer.limit) if self.batching else (head.rows or 1)
        waits = {n: self._workers.worker(d).wait_runs() for n, d in self._devices.items()}
        return self.policy.choose(DecisionContext(self._reading(), waits, max(1, rows)))

    def _pump(self) -> None:
        """Dispatch every batch that can go now; arrange to be called again when more can."""
        while True:
            head = self._queue.head()
            if head is None:
                return
            decision = self._decide(head)
            device = self._devices[decision.plan]
            worker = self._workers.worker(device)
            if worker.in_use >= worker.slots:
                if device not in self._waiting_for:
                    self._waiting_for.add(device)
                    worker.when_free(lambda: self._slot_freed(device))
                return
            batch = self._collect(head, decision.plan)
            if batch is None:
                return  # a batch timer is set
            acquired = worker.try_acquire()
            assert acquired, "a slot was checked free just above, with no await in between"
            self.last_decision = decision
            self._submit(decision, batch, worker)

    def _slot_freed(self, device: str) -> None:
        self._waiting_for.discard(device)
        self._pump()

    def _collect(self, head: QueuedRequest, plan_name: str) -> list[QueuedRequest] | None:
        """The next batch for ``plan_name`` (taken off the queue), or None and a timer set when it
        should wait for company: until it is ready or ``max_queue_delay_us`` after its oldest request."""
        if not self.batching or head.rows is None:
            self._queue.take([head])
            return [head]
        candidates = self._queue.live(lambda entry: entry.rows is not None and entry.batch_key == head.batch_key
                                      and entry.plan_hint in (None, plan_name))
        waiting_rows = sum(entry.rows or 0 for entry in candidates)
        flush_at = min(entry.enqueued_at for entry in candidates) + self._delay_s
        remaining_s = flush_at - time.monotonic()
        if not (self._sizer.ready(waiting_rows) or remaining_s <= 0 or self._closing):
            if self._timer is None or self._timer.when() > self._loop.time() + remaining_s:
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = self._loop.call_later(remaining_s, self._timer_fired)
            return None
        batch = candidates[:self._sizer.take([entry.rows or 0 for entry in candidates])]
        self._queue.take(batch)
        return batch

    def _timer_fired(self) -> None:
        self._timer = None
        self._pump()

    def _submit(self, decision: Decision, batch: list[QueuedRequest], worker: DeviceWorker) -> None:
        reading = self._reading()
        rows = [entry.rows or 1 for entry in batch]
        self.in_flight += len(batch)
        loop = self._loop

        def deliver(future: Any) -> None:  # worker thread: hand the outcome to the loop
            try:
                loop.call_soon_threadsafe(self._finish, decision, batch, rows, worker, reading, future)
            except RuntimeError:  # NOTE: the loop closed while this run was in flight; nobody waits
                log.debug("model %s: event loop closed before a run finished; outcome dropped", self.name)

        worker.submit(self._execute, decision.plan, [entry.feeds for entry in batch], rows).add_done_callback(deliver)

    def _finish(self, decision: Decision, batch: list[QueuedRequest], rows: list[int], worker: DeviceWorker,
                reading: LoadReading, done: Any) -> None:
        """On the loop, after a run: answer its requests, learn, free the slot, dispatch more."""
        self.in_flight -= len(batch)
        worker.release()
        try:
            parts, started, finished, ran, failure = done.result()
        except Exception as exc:  # hand every failure to its callers, keep serving others
            self.counters["failures"] += len(batch)
            self.policy.observe(decision.plan, 0.0, sum(rows), reading, ok=False)
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(exc)
        else:
            fallback = failure.reason if failure is not None else None
            compute_ms = (finished - started) * 1e3
            self.policy.observe(decision.plan, compute_ms, sum(rows), reading, ok=fallback is None)
            self._sizer.observe(sum(rows), compute_ms)
            self._count(decision, len(batch), sum(rows), fallback)
            plan = self.plans[ran]
            for entry, outputs in zip(batch, parts):
                if not entry.future.done():
                    entry.future.set_result(InferenceResult(
                        outputs=outputs, plan=ran, backends=tuple(plan.backends),
                        queue_ms=(started - entry.enqueued_at) * 1e3, compute_ms=compute_ms,
                        batch_size=sum(rows), request_id=entry.request_id, fallback=fallback,
                        retried=failure is not None and failure.retried,
                        ran_twice=failure is not None and failure.maybe_ran))
        self._pump()

    def _count(self, decision: Decision, requests: int, rows: int, fallback: str | None) -> None:
        self.counters[f"plan:{decision.plan}"] += requests
        self.counters[f"batch_size:{rows}"] += 1
        self.counters["success"] += requests
        if decision.explored:
            self.counters["explored"] += 1
        if fallback is not None:
            self.counters["fallbacks"] += requests
            self.counters[f"fallback:{decision.plan}"] += requests

    def _execute(self, plan_name: str, feeds: list[dict],
                 rows: list[int]) -> tuple[list[dict], float, float, str, PlanFailure | None]:
        """Worker thread: join, run (falling back to the cpu plan on BackendError), split."""
        started = time.monotonic()
        joined = join_feeds(feeds)
        ran, failure = plan_name, None
        try:
            outputs = self.plans[plan_name].run(joined)
            # A multi-stage plan (PlanExecutor) that re-ran a stage on cpu answers, but says so here
            # (same worker thread); the request's result and metrics must carry it, not only the log.
            stage_note = getattr(self.plans[plan_name], "last_fallback", None)
            if isinstance(stage_note, str) and stage_note:
                failure = PlanFailure(stage_note)
        except BackendError as exc:
            if self._cpu_plan is None or self._cpu_plan == plan_name:
                raise
            log.warning("model %s: plan %s failed (%s); re-running on %s", self.name, plan_name, exc, self._cpu_plan)
            ran, failure = self._cpu_plan, PlanFailure.of(plan_name, exc)
            outputs = self.plans[ran].run(joined)
        if self._monitor is not None and self._devices[plan_name] == "gpu":
            self._monitor.note_gpu_busy(started, time.monotonic())
        parts = split_outputs(outputs, rows)
        return parts, started, time.monotonic(), ran, failure

    def stats(self) -> dict[str, Any]:
        """Counters for metrics. Flat integer counters (present once non-zero):

        ``plan:<name>`` requests per chosen plan, ``batch_size:<rows>`` runs per
        batch size, ``explored`` exploring decisions, ``fallbacks`` and
        ``fallback:<plan>`` requests re-run on cpu, ``rejected_queue_full``,
        ``deadline_exceeded``, ``failures``, ``success``. Also ``pending``,
        ``in_flight``, ``policy``, ``batching``, ``batch_limit`` (the AIMD limit)
        and ``estimates_ms`` (cost policy: learned unloaded ms per row per plan).
        """
        return {"pending": self.pending, "in_flight": self.in_flight, "policy": self.policy.name,
                "batching": self.batching, "batch_limit": self._sizer.limit if self.batching else 1,
                "estimates_ms": self.policy.estimates_ms(), **dict(self.counters)}

