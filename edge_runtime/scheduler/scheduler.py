"""``ModelScheduler``: one model's bounded priority queue, plan choice, batching and dispatch.

Requests are validated on arrival (unless the data plane did) and queued by
priority (bounded: overflow is an immediate ``QueueFullError``). Dispatch is
event-driven: on every arrival, freed device slot and batch timer, ``_pump``
(on the loop) takes the highest-priority live request, asks the policy for a
plan under the current load, gathers compatible requests into a batch
(``batching.py``) once the batch is ready, takes a slot on that plan's device
worker and hands the batch to the worker's thread, so the event loop never
blocks on a busy model. (A lone request of at most ``inline_max_ms`` on an idle
model and an idle loop runs on the loop itself instead: ``inline.py``.) When a run ends, that thread posts the answers to the loop and takes
the next ready batch for its device itself (``_drive``): the loop is not on
the path between two runs (each hop through a busy loop costs tens to
hundreds of microseconds on a small core). It hands its slot back when no
batch is ready, or when another model waits for the device. One lock guards
the queue, policy and counters, which the loop and the worker threads share. A
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
import threading
import time
from collections import Counter
from concurrent.futures import Executor
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from backends.base import TensorSpec
from edge_runtime.errors import DeadlineExceededError, EdgeRuntimeError
from edge_runtime.load_monitor import LoadMonitor, LoadReading
from edge_runtime.scheduler.batch_probe import BatchingDecision, decide_batching
from edge_runtime.scheduler.batching import BatchSizer, batch_key, request_rows
from edge_runtime.scheduler.execution import BatchRun, run_batch
from edge_runtime.scheduler.inline import InlineGate
from edge_runtime.scheduler.config import ModelConfig
from edge_runtime.scheduler.plans import Plan, plan_device, plan_kind
from edge_runtime.scheduler.policy import Decision, DecisionContext, Policy, make_policy
from edge_runtime.scheduler.queue import RequestQueue
from edge_runtime.scheduler.recheck import PlanRecheck
from edge_runtime.scheduler.request import InferenceResult, QueuedRequest
from edge_runtime.scheduler.shape_jobs import DEFERRED_PRIORITY, ShapeJob, ShapeJobs
from edge_runtime.scheduler.single_thread import SingleThreadSwitch
from edge_runtime.scheduler.spin import SpinSwitch, spinning_now
from edge_runtime.scheduler.workers import DeviceWorker, DeviceWorkers
from edge_runtime.validation import validate_feeds

log = logging.getLogger(__name__)

PlanChooser = Callable[[Mapping[str, Plan], QueuedRequest], str]


class _Width(NamedTuple):
    """What a run takes of its device: ``units`` (cores on the cpu worker) and, on the cpu plan of an
    unbatched model with a one-thread switch, the ``session`` it is bound to (``"pool"``, ``"single"``;
    None: the switch chooses when the run starts)."""

    units: int
    session: str | None


class ModelScheduler:
    """Queue + dispatcher for one model. Use ``async with`` or ``start()`` / ``close()``.

    ``choose_plan`` (legacy hook) overrides the policy; otherwise ``policy`` or
    the one ``config.scheduler`` names is used. ``monitor`` supplies load
    readings (none: load unknown). ``workers`` are the device workers to share
    with other models (default: private ones on ``executor``). ``outputs``
    lets batching check that every output has a batch dimension; without it
    only the inputs are checked; ``batching`` (the load-time experiment's
    decision, ``batch_probe.py``) overrides that check. ``default_plan`` is what
    ``plan = "auto"`` means.
    ``owned`` objects (models compiled for extra plans) are closed by ``close()``. ``spin_switch``:
    the cpu plan's switch between its spinning session and a quiet twin (``spin.py``), for stats;
    ``single_thread``: its switch between the pool session and a one-thread one (``single_thread.py``).
    """

    def __init__(self, name: str, inputs: list[TensorSpec], plans: Mapping[str, Plan],
                 config: ModelConfig, executor: Executor | None = None,
                 choose_plan: PlanChooser | None = None, *, outputs: list[TensorSpec] | None = None,
                 monitor: LoadMonitor | None = None, workers: DeviceWorkers | None = None,
                 policy: Policy | None = None, default_plan: str | None = None,
                 owned: Sequence[Any] = (), batching: BatchingDecision | None = None,
                 recheck: PlanRecheck | None = None, spin_switch: SpinSwitch | None = None,
                 single_thread: SingleThreadSwitch | None = None) -> None:
        if not plans:
            raise ValueError("a scheduler needs at least one plan")
        self.name = name
        self.inputs = list(inputs)
        self.plans = dict(plans)
        self.config = config
        self.policy = policy or make_policy(config.scheduler, self.plans, default_plan)
        self.recheck = recheck  # abandons the served plan for a candidate measured faster (recheck.py)
        self.spin_switch = spin_switch  # the cpu plan's spinning session or quiet twin, per run (spin.py)
        self.single_thread = single_thread  # the cpu plan's pool or one-thread session, per run (single_thread.py)
        # The plan whose runs the switch serves: a run there may take one core instead of the pool's.
        self._switch_plan = next((n for n, p in self.plans.items()
                                  if single_thread is not None and getattr(p, "call", None) is single_thread), None)
        self._chooser = choose_plan
        self._monitor = monitor
        self._own_workers = workers is None
        self._workers = workers or DeviceWorkers(executor)
        self._devices = {plan_name: plan_device(plan) for plan_name, plan in self.plans.items()}
        cpu_plans = [n for n, p in self.plans.items() if plan_kind(n, p) == "cpu"]
        self._cpu_plan = "cpu" if "cpu" in self.plans else (cpu_plans[0] if cpu_plans else None)
        # Without a load-time decision (tests, tools), the declared shapes decide.
        self.batching_decision = batching or decide_batching(config.batching, self.inputs, outputs or [], None)
        self.batching = self.batching_decision.enabled
        self._sizer = BatchSizer(config.batching, dict(self.batching_decision.cost_ms_per_row))
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
        # Guards the queue, counters, policy and sizer: the loop and the device workers' threads share them.
        self._lock = threading.RLock()
        self._shape_jobs = ShapeJobs(name, self.inputs)  # load work waiting for the first request's shapes
        self._inline = InlineGate(config.scheduler.inline_max_ms)  # an idle model's short runs on the loop

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
        with self._lock:
            self._queue.fail_all(EdgeRuntimeError(f"model {self.name!r} is shutting down"))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._shape_jobs.cancel()
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

    def defer_until_shapes(self, job: ShapeJob) -> None:
        """Run ``job(shapes)`` once, in the background, at the first request's shapes (``shape_jobs.py``);
        its requests should use ``DEFERRED_PRIORITY``. A job's failure is logged, never raised."""
        self._shape_jobs.add(job)

    def set_batching(self, decision: BatchingDecision) -> None:
        """Serve by ``decision`` from now on (the deferred batching experiment's outcome)."""
        with self._lock:
            self.batching_decision = decision
            self.batching = decision.enabled

    # -- requests ----------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self._queue)

    async def infer(self, feeds: Mapping[str, Any], *, priority: int = 0, timeout_ms: float | None = None,
                    request_id: str | None = None, plan: str | None = None,
                    validated: bool = False) -> InferenceResult:
        """Queue one request and wait for its result; ``validated``: the caller already ran ``validate_feeds``.

        Raises InvalidInputError (bad feeds, before queueing), QueueFullError
        (queue at ``max_queue_size``), DeadlineExceededError (``timeout_ms``, or
        the model's ``default_timeout_ms``, passed first), BackendError.
        """
        if self._closing:
            raise EdgeRuntimeError(f"model {self.name!r} is shutting down")
        if plan is not None and plan not in self.plans:
            raise EdgeRuntimeError(f"model {self.name!r} has no plan {plan!r}; plans: {sorted(self.plans)}")
        arrays = dict(feeds) if validated else validate_feeds(self.inputs, feeds)
        timeout_ms = timeout_ms if timeout_ms else (self.config.queue.default_timeout_ms or None)
        deadline = time.monotonic() + timeout_ms / 1e3 if timeout_ms else None
        future = asyncio.get_running_loop().create_future()
        entry = QueuedRequest(priority=priority, feeds=arrays, future=future, deadline=deadline,
                              request_id=request_id, plan_hint=plan, rows=request_rows(arrays),
                              batch_key=batch_key(arrays))
        with self._lock:
            self._queue.push(entry)  # QueueFullError when full
            self._inline.arrived(entry.enqueued_at)
        if self._loop is None:
            await self.start()
        self._pump()
        if self._shape_jobs.waiting and priority != DEFERRED_PRIORITY:
            self._shape_jobs.start(arrays)
        try:
            if deadline is None:
                return await future
            # wait_for cancels the future on timeout: the pump skips it; a running one finishes unseen.
            return await asyncio.wait_for(future, max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            with self._lock:
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
        decision = self.policy.choose(DecisionContext(self._reading(), waits, max(1, rows)))
        return decision if self.recheck is None else self.recheck.override(decision)

    def _pump(self) -> None:
        """On the loop: dispatch every batch that can go now; arrange to be called again when more can.
        A lone short request on an idle model runs here, on the loop (``inline.py``)."""
        inline = self._dispatch()
        if inline is not None:
            self._run_inline(*inline)

    def _dispatch(self) -> tuple[Decision, list[QueuedRequest], DeviceWorker, _Width] | None:
        """``_pump``'s work under the lock; returns the batch to run on the loop, if one should be."""
        with self._lock:
            while True:
                head = self._queue.head()
                if head is None:
                    return None
                decision = self._decide(head)
                device = self._devices[decision.plan]
                worker = self._workers.worker(device)
                narrowest = 1 if decision.plan == self._switch_plan else worker.run_units
                if not worker.has_room(narrowest):
                    self._wait_for(device, worker, narrowest)
                    return None
                # Under load when another run is in flight or more requests wait than this one.
                busy = worker.in_use > 0 or len(self._queue) > 1
                if self._beside(head, decision.plan, worker, busy=busy):
                    batch, width = [head], _Width(1, "single")
                else:
                    batch = self._collect(head, decision.plan)
                    if batch is None:
                        return None  # a batch timer is set
                    width = self._width(decision.plan, batch, worker, busy=busy)
                # Only loops take slots (worker threads give them back), but a wider run than the
                # narrowest may still not fit: it waits, queued, for the cores it needs.
                if not worker.try_acquire(width.units):
                    self._wait_for(device, worker, width.units)
                    return None
                self._queue.take(batch)
                self.last_decision = decision
                self.in_flight += len(batch)
                if self._inline_now(batch, worker, width.units):
                    return decision, batch, worker, width
                worker.submit(self._drive, decision, batch, worker, width)

    def _wait_for(self, device: str, worker: DeviceWorker, units: int) -> None:
        """Under the lock: pump again once ``units`` of ``device`` may be free."""
        if device not in self._waiting_for:
            self._waiting_for.add(device)
            worker.when_free(lambda: self._slot_freed(device), owner=self, units=units)

    def _width(self, plan_name: str, batch: list[QueuedRequest], worker: DeviceWorker, *, busy: bool) -> "_Width":
        """Under the lock: the device units a run of ``batch`` takes and the session of the cpu plan's
        one-thread switch it is bound to (``single_thread.py``). ``busy``: an unbatched model under
        load, where cost per core decides and a one-thread run takes one core, beside the next.

        A batching model keeps one run at a time on its cores, the session chosen by the run's own
        time: splitting its batches over one-thread runs was measured slower in process (the zoo's
        MobileNet, 0.19 ms a row per core either way: 4,200-5,800 rows/s against 6,100-6,900 on the
        pool; more runs' Python, the GIL contended), and a batch already lets the pool's threads share
        the rows. (Its single rows may instead go beside each other where batches do not pay: ``_beside``.)"""
        if plan_name != self._switch_plan or worker.run_units == 1 or self.batching:
            return _Width(worker.run_units, None)
        plan = self.single_thread.plan_run(batch[0].feeds, throughput=busy)  # unbatched: one request a run
        if not plan.beside:  # all the cores, as a batching model's run: the switch chooses when it starts
            return _Width(worker.run_units, None)
        return _Width(1, plan.session)

    def _beside(self, head: QueuedRequest, plan_name: str, worker: DeviceWorker, *, busy: bool) -> bool:
        """Under the lock: whether ``head``, one row of a batching model under load, runs alone on the
        one-thread session beside another run rather than in a batch on every core: where a row on one
        thread costs less per core than a row of the pool's batches at their best measured size
        (``SingleThreadSwitch.beside_batches``). Batching pays only where a batch makes a row cheaper;
        on the PP-OCR classifier (2 cores, in process, ``tools/bench_server.py``'s one-thread sides) a
        row costs 0.81 ms alone on one thread and 1.15 ms in a 16-row batch there, and two one-thread
        sessions side by side served 2,398 rows/s against 1,749 for ORT's best batch."""
        if not (busy and self.batching and plan_name == self._switch_plan and worker.run_units > 1
                and head.rows == 1):
            return False
        batch_row_ms = self._sizer.curve.batch_row_ms()
        return batch_row_ms is not None and self.single_thread.beside_batches(head.feeds, batch_row_ms)

    def _inline_now(self, batch: list[QueuedRequest], worker: DeviceWorker, units: int) -> bool:
        """Under the lock, ``units`` just taken for ``batch``: whether it runs on the loop (``inline.py``)."""
        if worker.device != "cpu" or len(batch) != 1 or (batch[0].rows or 1) != 1:
            return False
        idle = (self.in_flight == 1 and not len(self._queue) and worker.in_use == units and not worker.waiting)
        return self._inline.allows(self._sizer.curve.per_row_ms_at(1), idle=idle, loop=self._loop)

    def _run_inline(self, decision: Decision, batch: list[QueuedRequest], worker: DeviceWorker,
                    width: "_Width") -> None:
        """On the loop: run ``batch`` here, give the slot back and answer it (what ``_drive`` does in a
        worker thread, without the two hand-offs)."""
        reading = self._reading()
        rows = [entry.rows or 1 for entry in batch]
        try:
            outcome: Any = self._execute(decision.plan, [entry.feeds for entry in batch], rows, width.session)
        except Exception as exc:  # answered to the caller like a worker's failure
            outcome = exc
        with self._lock:
            self.counters["inline"] += 1
        worker.release(width.units)  # wakes other schedulers waiting for the device
        # Nothing was queued behind this run: the loop ran it, so no request could arrive meanwhile.
        self._finish(decision, batch, rows, reading, outcome)

    def _slot_freed(self, device: str) -> None:
        with self._lock:
            self._waiting_for.discard(device)
        self._pump()

    def _collect(self, head: QueuedRequest, plan_name: str, *, on_loop: bool = True) -> list[QueuedRequest] | None:
        """The next batch for ``plan_name`` (left queued: the caller takes it once it has the cores), or
        None when it should wait for company: until it is ready or ``max_queue_delay_us`` after its oldest
        request (on the loop a timer is set)."""
        if not self.batching or head.rows is None:
            return [head]
        candidates = self._queue.live(lambda entry: entry.rows is not None and entry.batch_key == head.batch_key
                                      and entry.plan_hint in (None, plan_name))
        waiting_rows = sum(entry.rows or 0 for entry in candidates)
        flush_at = min(entry.enqueued_at for entry in candidates) + self._delay_s
        remaining_s = flush_at - time.monotonic()
        # Company is worth waiting for only while a run of this model is in flight (requests then gather
        # behind it); an idle model, or a worker whose run just ended, goes with what is waiting.
        idle = not on_loop or self.in_flight == 0
        if not (idle or self._sizer.ready(waiting_rows) or remaining_s <= 0 or self._closing):
            if on_loop and (self._timer is None or self._timer.when() > self._loop.time() + remaining_s):
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = self._loop.call_later(remaining_s, self._timer_fired)
            return None
        return candidates[:self._sizer.take([entry.rows or 0 for entry in candidates])]

    def _timer_fired(self) -> None:
        self._timer = None
        self._pump()

    def _drive(self, decision: Decision, batch: list[QueuedRequest], worker: DeviceWorker, width: "_Width") -> None:
        """Worker thread: run the batch, hand its outcome to the loop, then take the next batch for this
        device itself (no round trip through the loop between two runs) until none is ready."""
        loop = self._loop
        while True:
            reading = self._reading()
            rows = [entry.rows or 1 for entry in batch]
            try:
                outcome: Any = self._execute(decision.plan, [entry.feeds for entry in batch], rows, width.session)
            except Exception as exc:  # handed to the callers on the loop; this thread keeps serving
                outcome = exc
            # NOTE: the slot is given back (or the next batch taken) before the loop hears of this run:
            # the loop, woken by the hand-off, may hold the GIL for a switch interval (5 ms) and take
            # new requests meanwhile, and those must not find the device still busy.
            more = False  # requests left queued once this worker gives its slot back
            with self._lock:
                try:
                    following = self._next_for(worker, width.units)
                except Exception:  # a bug in choosing: never strand the slot (and every later request)
                    log.exception("model %s: choosing the next batch failed; the loop takes over", self.name)
                    following = None
                if following is None:
                    worker.release(width.units)  # wakes the waiting schedulers on their loops
                    more = len(self._queue) > 0
                else:
                    self.last_decision = following[0]
                    self.in_flight += len(following[1])
                    if following[2].units < width.units:  # a narrower run next: the rest is free now
                        worker.release(width.units - following[2].units)
                        more = len(self._queue) > 0  # for another run beside it
            try:
                loop.call_soon_threadsafe(self._finish, decision, batch, rows, reading, outcome)
                if more:
                    loop.call_soon_threadsafe(self._pump)  # a timer to set, or another device to use
            except RuntimeError:  # NOTE: the loop closed while this run was in flight; nobody waits
                log.debug("model %s: event loop closed before a run finished; outcome dropped", self.name)
                if following is not None:
                    worker.release(following[2].units)
                return
            if following is None:
                return
            decision, batch, width = following

    def _next_for(self, worker: DeviceWorker, held: int) -> tuple[Decision, list[QueuedRequest], "_Width"] | None:
        """Under the lock, off the loop: the next batch that is ready now for ``worker``'s device, if no
        other scheduler waits for that device (fairness between the models sharing it) and it needs no
        more than the ``held`` units (a wider run waits for the loop to find its cores free)."""
        if worker.others_waiting(self):
            return None
        dead: list[QueuedRequest] = []
        head = self._queue.head(dead)
        if dead:  # their futures are answered on the loop
            self._loop.call_soon_threadsafe(self._queue.expire, dead)
        if head is None:
            return None
        decision = self._decide(head)
        if self._devices[decision.plan] != worker.device:
            return None
        # A batch ready the moment a run ends gathered during it: requests come faster than runs end.
        if self._beside(head, decision.plan, worker, busy=True):
            batch, width = [head], _Width(1, "single")
        else:
            batch = self._collect(head, decision.plan, on_loop=False)
            if batch is None:
                return None
            width = self._width(decision.plan, batch, worker, busy=True)
        if width.units > held:
            return None
        self._queue.take(batch)
        return decision, batch, width

    def _finish(self, decision: Decision, batch: list[QueuedRequest], rows: list[int], reading: LoadReading,
                outcome: Any) -> None:
        """On the loop, after a run: answer its requests and learn (the worker already moved on)."""
        with self._lock:
            self.in_flight -= len(batch)
            if isinstance(outcome, BaseException):
                self.counters["failures"] += len(batch)
                self.policy.observe(decision.plan, 0.0, sum(rows), reading, ok=False)
                self._recheck_observe(decision.plan, 0.0, sum(rows), ok=False)
            else:
                parts, started, finished, ran, failure = outcome
                fallback = failure.reason if failure is not None else None
                compute_ms = (finished - started) * 1e3
                self.policy.observe(decision.plan, compute_ms, sum(rows), reading, ok=fallback is None)
                self._recheck_observe(decision.plan, compute_ms, sum(rows), ok=fallback is None)
                self._sizer.observe(sum(rows), compute_ms)
                self._count(decision, len(batch), sum(rows), fallback)
        if isinstance(outcome, BaseException):
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(outcome)
            return
        backends = tuple(self.plans[ran].backends)
        for entry, outputs in zip(batch, parts):
            if not entry.future.done():
                entry.future.set_result(InferenceResult(
                    outputs=outputs, plan=ran, backends=backends,
                    queue_ms=(started - entry.enqueued_at) * 1e3, compute_ms=compute_ms,
                    batch_size=sum(rows), request_id=entry.request_id, fallback=fallback,
                    retried=failure is not None and failure.retried,
                    ran_twice=failure is not None and failure.maybe_ran,
                    fallback_labels=failure.labels if failure is not None else None))

    def _recheck_observe(self, plan: str, compute_ms: float, rows: int, ok: bool) -> None:
        if self.recheck is None:
            return
        before = sum(self.recheck.abandoned.values())
        self.recheck.observe(plan, compute_ms, rows, ok)
        if sum(self.recheck.abandoned.values()) != before:
            self.counters["abandoned"] += 1

    def abandoned(self) -> dict[tuple[str, str], int]:
        """(plan, reason) -> times the re-check abandoned that plan (``edge_runtime_plan_abandoned_total``)."""
        with self._lock:
            return dict(self.recheck.abandoned) if self.recheck is not None else {}

    def _count(self, decision: Decision, requests: int, rows: int, fallback: str | None) -> None:
        self.counters[f"plan:{decision.plan}"] += requests
        self.counters[f"batch_size:{rows}"] += 1
        self.counters["success"] += requests
        if decision.explored:
            self.counters["explored"] += 1
        if fallback is not None:
            self.counters["fallbacks"] += requests
            self.counters[f"fallback:{decision.plan}"] += requests

    def _execute(self, plan_name: str, feeds: list[dict], rows: list[int], session: str | None = None) -> BatchRun:
        """Worker thread: one batch through ``run_batch`` (falling back to the cpu plan); ``session``: the
        one-thread switch's session chosen at dispatch (its cores were taken for it)."""
        monitor = self._monitor if self._devices[plan_name] == "gpu" else None
        if session is None or self.single_thread is None:
            return run_batch(self.name, self.plans, plan_name, self._cpu_plan, feeds, rows, monitor)
        switch = self.single_thread
        switch.bind(session)
        try:
            return run_batch(self.name, self.plans, plan_name, self._cpu_plan, feeds, rows, monitor)
        finally:
            switch.bind(None)

    def stats(self) -> dict[str, Any]:
        """Counters for metrics. Flat integer counters (present once non-zero):

        ``plan:<name>`` requests per chosen plan, ``batch_size:<rows>`` runs per
        batch size, ``explored`` exploring decisions, ``fallbacks`` and
        ``fallback:<plan>`` requests re-run on cpu, ``rejected_queue_full``,
        ``deadline_exceeded``, ``failures``, ``success``, ``inline`` (runs on the event loop, ``inline.py``). Also ``pending``,
        ``in_flight``, ``policy``, ``batching``, ``batch_limit`` (the AIMD limit),
        ``estimates_ms`` (cost policy: learned unloaded ms per row per plan), ``spinning``
        (whether the spin policy lets the model's CPU pool threads spin now, ``spin.py``),
        ``spin_runs`` (runs on the spinning session and on its quiet twin, where it has one),
        ``single_thread`` (runs on the pool and the one-thread session, and what each costs per
        row, where the model has both),
        ``cost_ms_per_row`` (the batcher's measured cost curve) and ``batch_knee`` (its knee).
        """
        with self._lock:
            return {"pending": self.pending, "in_flight": self.in_flight, "policy": self.policy.name,
                    "batching": self.batching, "batch_limit": self._sizer.limit if self.batching else 1,
                    "estimates_ms": self.policy.estimates_ms(),
                    "spinning": spinning_now(self.config.scheduler.spin, self.in_flight)
                    and (self.spin_switch is None or self.spin_switch.spin_now()),
                    **({"spin_runs": dict(self.spin_switch.runs)} if self.spin_switch is not None else {}),
                    **({"single_thread": self.single_thread.snapshot()} if self.single_thread is not None else {}),
                    "cost_ms_per_row": self._sizer.curve.per_row_ms(), "batch_knee": self._sizer.curve.knee(),
                    **dict(self.counters),
                    **({"recheck": self.recheck.snapshot()} if self.recheck is not None else {})}

