"""Under load an unbatched small cpu model's runs go one thread each, side by side, where that is
measured cheaper per core (``scheduler/single_thread.py``, the cpu worker's slots in cores: ``workers.py``);
a batching model's lone rows likewise, where its batches cost more per core than a row alone on one thread.

Decisions are checked with sessions whose cost is set by the test on a per-thread fake clock
(nothing depends on this machine's speed), while each run also sleeps for real so that runs
that may overlap do; the daemon's wiring is checked on the default configuration with real
sessions and timings: the answers must equal plain ONNX Runtime's and every decided shape must
be served by the session its own measurements make cheaper per core.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from edge_runtime.scheduler import DeviceWorkers, ModelScheduler, model_config
from edge_runtime.scheduler.factory import scheduler_for, serving_options
from edge_runtime.scheduler.plans import CallablePlan
from edge_runtime.scheduler.single_thread import (
    EXPLORE_EVERY,
    MIN_RUNS,
    SIDE_BY_SIDE_MARGIN,
    SIDE_BY_SIDE_MIN_MS,
    RunPlan,
    SingleThreadSwitch,
)
from edge_runtime.scheduler.workers import DeviceWorker
from scheduler_fakes import assert_like_ort

REAL_S = 0.02  # what every fake run also sleeps: long enough for runs dispatched together to overlap


class _Sessions:
    """A pool session of ``threads`` threads and a one-thread session whose runs cost the given ms per
    row on a per-thread fake clock; records each run's session, rows and the overlap of runs."""

    def __init__(self, pool_ms_per_row: float, single_ms_per_row: float, threads: int = 2, *,
                 batch_ms_per_row: float | None = None, sleep_by_cost: bool = False) -> None:
        self.cost = {"pool": pool_ms_per_row, "single": single_ms_per_row}
        self.batch_cost = batch_ms_per_row  # the pool's ms per row in runs of 2 rows or more
        self.sleep_by_cost = sleep_by_cost  # sleep what the run costs (the scheduler times runs for real)
        self.threads = threads
        self._local = threading.local()
        self._lock = threading.Lock()
        self.cores_busy = 0
        self.peak_cores = 0
        self.peak_single = 0
        self._single = 0
        self.runs: list[tuple[str, int]] = []

    def clock(self) -> float:
        return getattr(self._local, "now", 0.0)

    def run(self, name: str):
        cores = self.threads if name == "pool" else 1

        def call(feeds):
            rows = feeds["input"].shape[0]
            with self._lock:
                self.cores_busy += cores
                self._single += name == "single"
                self.peak_cores = max(self.peak_cores, self.cores_busy)
                self.peak_single = max(self.peak_single, self._single)
                self.runs.append((name, rows))
            per_row = self.batch_cost if name == "pool" and rows > 1 and self.batch_cost else self.cost[name]
            time.sleep(per_row * rows / 1e3 if self.sleep_by_cost else REAL_S)
            self._local.now = self.clock() + per_row * rows / 1e3
            with self._lock:
                self.cores_busy -= cores
                self._single -= name == "single"
            return {"output": feeds["input"] * 2.0}
        return call

    def switch(self) -> SingleThreadSwitch:
        return SingleThreadSwitch(self.run("pool"), self.run("single"), clock=self.clock, pool_threads=self.threads)


def _scheduler(sessions: _Sessions, batching: dict | None = None,
               cost_ms_per_row: dict[int, float] | None = None) -> tuple[ModelScheduler, DeviceWorkers]:
    from backends.base import TensorSpec

    from edge_runtime.scheduler.batch_probe import BatchingDecision

    switch = sessions.switch()
    plan = CallablePlan("cpu", ("cpu",), switch)
    workers = DeviceWorkers(cpu_cores=sessions.threads)
    config = model_config({"batching": batching or {"max_batch_size": 0}, "scheduler": {"inline_max_ms": 0}})
    spec = [TensorSpec("input", "float32", ("batch", 4))]
    decision = None
    if cost_ms_per_row is not None:  # the load-time experiment's outcome, as the factory passes it
        decision = BatchingDecision(True, "measured", config.batching.max_batch_size,
                                    cost_ms_per_row=tuple(sorted(cost_ms_per_row.items())))
    return ModelScheduler("m", spec, {"cpu": plan}, config, outputs=[TensorSpec("output", "float32", ("batch", 4))],
                          workers=workers, default_plan="cpu", single_thread=switch, batching=decision), workers


def _x(k: float, rows: int = 1) -> dict[str, np.ndarray]:
    return {"input": np.full((rows, 4), k, np.float32)}


def test_a_switch_compares_cost_per_core_under_load_and_time_per_run_alone() -> None:
    """0.6 ms a row on two threads (1.2 core-ms) against 0.9 on one: alone the pool, under load one thread."""
    sessions = _Sessions(pool_ms_per_row=0.6, single_ms_per_row=0.9)
    switch = sessions.switch()
    for _ in range(2 * (MIN_RUNS + 1)):  # measures both sessions (pool first)
        switch(_x(1.0, 4))
    shapes = {"input": (4, 4)}
    assert switch.plan_run(shapes, throughput=False) == RunPlan(None, False)  # alone: the run chooses
    assert switch(_x(1.0, 4)) and sessions.runs[-1][0] == "pool"  # ... the shorter run
    assert switch.plan_run(shapes, throughput=True).session == "single"
    assert switch.plan_run(shapes, throughput=True).beside  # 3.6 ms a run: worth a core of its own
    cheap_pool = _Sessions(pool_ms_per_row=0.4, single_ms_per_row=0.9).switch()  # 0.8 core-ms: the pool wins both
    for _ in range(2 * (MIN_RUNS + 1)):
        cheap_pool(_x(1.0, 4))
    assert cheap_pool.plan_run(shapes, throughput=True).session == "pool"
    near = _Sessions(pool_ms_per_row=0.5, single_ms_per_row=0.9).switch()  # 1.0 core-ms: within the margin
    for _ in range(2 * (MIN_RUNS + 1)):
        near(_x(1.0, 4))
    assert 0.5 * 2 * SIDE_BY_SIDE_MARGIN < 0.9 and near.plan_run(shapes, throughput=True).session == "pool"


def test_one_thread_runs_too_short_to_pay_for_their_own_python_never_go_side_by_side() -> None:
    per_row = SIDE_BY_SIDE_MIN_MS / 4
    switch = _Sessions(pool_ms_per_row=per_row * 1.5, single_ms_per_row=per_row).switch()
    for _ in range(2 * (MIN_RUNS + 1)):
        switch(_x(1.0))
    assert switch.plan_run({"input": (1, 4)}, throughput=True) == RunPlan(None, False)  # all cores, chosen at run


def test_a_session_chosen_at_dispatch_is_the_one_the_run_uses() -> None:
    sessions = _Sessions(pool_ms_per_row=0.6, single_ms_per_row=0.9)
    switch = sessions.switch()
    for session in ("single", "pool"):
        switch.bind(session)
        switch(_x(1.0))
    switch.bind(None)
    assert [name for name, _ in sessions.runs] == ["single", "pool"]  # a first run of a shape goes to the pool
    switch.close()  # no one-thread session any more: a run bound to it goes to the pool
    switch.bind("single")
    np.testing.assert_array_equal(switch(_x(3.0))["output"], np.full((1, 4), 6.0, np.float32))
    switch.bind(None)
    assert sessions.runs[-1][0] == "pool"


def test_the_cpu_worker_counts_cores_a_full_run_takes_all_and_narrow_runs_one_each() -> None:
    worker = DeviceWorkers(cpu_cores=2).worker("cpu")
    assert (worker.capacity, worker.run_units) == (2, 2)
    assert worker.try_acquire(1) and worker.try_acquire(1)
    assert not worker.try_acquire(1) and not worker.has_room(1)
    worker.release(1)
    assert not worker.try_acquire() and worker.wait_runs() > 0  # a full run needs both cores
    worker.release(1)
    assert worker.try_acquire() and not worker.try_acquire(1)
    worker.release()
    assert worker.in_use == 0 and worker.wait_runs() == 0.0
    gpu = DeviceWorker("gpu", 1)
    assert (gpu.capacity, gpu.run_units) == (1, 1)
    worker.close()
    gpu.close()


async def test_under_load_one_thread_runs_go_two_at_a_time_on_two_cores_and_never_beside_a_pool_run() -> None:
    sessions = _Sessions(pool_ms_per_row=0.6, single_ms_per_row=0.9)
    sched, workers = _scheduler(sessions)
    try:
        async with sched:
            for k in range(2 * (MIN_RUNS + 1)):  # one at a time: both sessions measured, pool first
                out = await sched.infer(_x(k))
                np.testing.assert_array_equal(out.outputs["output"], _x(2.0 * k)["input"])
            alone = [name for name, _ in sessions.runs]
            assert alone == ["pool"] * (MIN_RUNS + 1) + ["single"] * (MIN_RUNS + 1)
            assert (await sched.infer(_x(1.0))).outputs["output"].shape == (1, 4)
            assert sessions.runs[-1][0] == "pool"  # alone: the session with the shorter run
            before = len(sessions.runs)
            results = await asyncio.gather(*(sched.infer(_x(k)) for k in range(24)))
    finally:
        workers.close()
    for k, result in enumerate(results):
        np.testing.assert_array_equal(result.outputs["output"], _x(2.0 * k)["input"])
    loaded = [name for name, _ in sessions.runs[before:]]
    assert loaded.count("single") >= 20, loaded  # under load: cheaper per core (one pool run in 64 explores)
    assert sessions.peak_single == 2, sessions.runs  # two one-thread runs at once on the two cores
    assert sessions.peak_cores == 2  # never a pool run beside another run: the cores are not oversubscribed


def test_a_batching_models_lone_rows_go_beside_where_its_batches_cost_more_per_core() -> None:
    """3.0 ms a row on one thread (3.1 with a run's Python) against batches at 2.0 ms a row on two threads
    (3.4 core-ms with the margin): beside; batches at 1.5 (2.55): batched. Decided once the one thread is
    measured."""
    sessions = _Sessions(pool_ms_per_row=2.0, single_ms_per_row=3.0)
    switch = sessions.switch()
    one_row = {"input": (1, 4)}
    assert not switch.beside_batches(one_row, 2.0)  # never seen: batched
    for _ in range(MIN_RUNS + 1):
        switch.bind("pool")
        switch(_x(1.0))
    switch.bind(None)
    assert switch.beside_batches(one_row, 2.0, explore=False)  # short on the pool: measure one thread
    for _ in range(MIN_RUNS + 1):
        switch.bind("single")
        switch(_x(1.0))
    switch.bind(None)
    alone = 3.0 + SIDE_BY_SIDE_MIN_MS  # a row on one thread and the scheduler's Python per run
    assert alone < 2.0 * 2 * SIDE_BY_SIDE_MARGIN and switch.beside_batches(one_row, 2.0, explore=False)
    assert alone > 1.5 * 2 * SIDE_BY_SIDE_MARGIN and not switch.beside_batches(one_row, 1.5, explore=False)
    assert not switch.beside_batches({"input": (2, 4)}, 2.0)  # a request of two rows joins batches
    choices = [switch.beside_batches(one_row, 2.0) for _ in range(EXPLORE_EVERY)]
    assert choices.count(False) == 1 and not choices[-1]  # one in EXPLORE_EVERY is batched, to measure batches


async def _burst_on_batching_model(batch_ms_per_row: float) -> _Sessions:
    """A batching model (one thread: 3.0 ms a row; the pool 2.0 alone) whose cost curve was measured at
    load with ``batch_ms_per_row`` for batches, its one-row runs measured on both sessions, then 48
    requests at once; every answer checked."""
    sessions = _Sessions(pool_ms_per_row=2.0, single_ms_per_row=3.0, batch_ms_per_row=batch_ms_per_row,
                         sleep_by_cost=True)
    curve = {1: 2.0, **{rows: batch_ms_per_row for rows in (2, 4, 8, 16)}}
    sched, workers = _scheduler(sessions, {"max_batch_size": 16, "max_queue_delay_us": 2_000}, curve)
    for session in ("pool", "single"):
        for _ in range(MIN_RUNS + 1):
            sched.single_thread.bind(session)
            sched.single_thread(_x(1.0))
    sched.single_thread.bind(None)
    del sessions.runs[:]
    try:
        async with sched:
            results = await asyncio.gather(*(sched.infer(_x(k)) for k in range(48)))
    finally:
        workers.close()
    for k, result in enumerate(results):
        np.testing.assert_array_equal(result.outputs["output"], _x(2.0 * k)["input"])
    return sessions


async def test_a_batching_model_under_load_runs_lone_rows_beside_each_other_where_batches_do_not_pay() -> None:
    sessions = await _burst_on_batching_model(batch_ms_per_row=2.0)  # flat: a batch saves nothing per row
    single = [rows for name, rows in sessions.runs if name == "single"]
    assert len(single) >= 40 and set(single) == {1}, sessions.runs
    assert sessions.peak_single == 2, sessions.runs  # two at once on the two cores
    assert sessions.peak_cores == 2  # never beside a pool run


async def test_a_batching_model_under_load_batches_where_a_batch_makes_a_row_cheaper() -> None:
    """Then each run takes every core (splitting batches over one-thread runs did not pay:
    ``scheduler._width``)."""
    sessions = await _burst_on_batching_model(batch_ms_per_row=1.0)  # 1.7 core-ms a row against 3.0
    assert all(name == "pool" for name, _ in sessions.runs[1:]), sessions.runs  # the first may run alone
    assert max(rows for _, rows in sessions.runs) > 1 and sessions.peak_cores == 2, sessions.runs


async def test_default_configuration_under_load_serves_each_shape_by_its_cost_per_core(runtime, cnn) -> None:
    """The daemon's scheduler on real sessions and timings: a burst of requests after a few alone."""
    path, proto = cnn
    config = model_config({})  # no batching: the default
    model = runtime.load(path, backend="cpu", options=serving_options(runtime, config))
    sched = scheduler_for(model, config, runtime, None)
    switch = sched.single_thread
    assert switch is not None and switch.pool_threads == 2
    rng = np.random.default_rng(21)
    feeds = [{"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(64)]
    try:
        async with sched:
            results = [await sched.infer(feed) for feed in feeds[:MIN_RUNS + 1]]
            await asyncio.to_thread(switch.wait_ready, 60.0)
            for start in range(MIN_RUNS + 1, 64, 16):
                results += await asyncio.gather(*(sched.infer(feed) for feed in feeds[start:start + 16]))
            snapshot = switch.snapshot()
            decided = {label: switch.choice({"input": (int(label.split(":")[1].split("x")[0]), 3, 32, 32)},
                                            throughput=True)
                       for label in snapshot["ms_per_row"]}
    finally:
        sched.discard()
        model.close()
    assert_like_ort(proto, feeds, results, "probabilities")
    assert snapshot["runs"]["pool"] >= MIN_RUNS + 1, snapshot
    assert any(choice is not None for choice in decided.values()), snapshot  # some shape decided
    for label, choice in decided.items():
        if choice is None:
            continue
        measured = snapshot["ms_per_row"][label]
        weight = 2 * SIDE_BY_SIDE_MARGIN if label in snapshot["beside"] else 1.0  # too short: time per run
        per_core = {"pool": measured["pool"] * weight, "single": measured["single"]}
        assert choice == min(per_core, key=per_core.__getitem__), (label, measured, choice)


async def test_a_batching_model_on_real_sessions_runs_lone_rows_by_their_measured_cost_per_core(runtime, cnn) -> None:
    """The daemon's scheduler with batching configured (its load-time cost curve, real sessions and
    timings): answers equal ONNX Runtime's, and a burst's lone rows go beside each other exactly when
    the switch's measurements, before and after the burst alike, make that cheaper per core than the
    batches' best measured row (at the margin, where the two readings differ, either is right). (On
    the zoo's CNN batches pay: 0.05 ms a row in batches of 4-8 on two threads against 0.10-0.18 for a
    row alone on one thread, here.)"""
    path, proto = cnn
    config = model_config({"batching": {"max_batch_size": 8}})
    model = runtime.load(path, backend="cpu", options=serving_options(runtime, config))
    sched = scheduler_for(model, config, runtime, None)
    switch = sched.single_thread
    assert switch is not None and sched.batching and sched._sizer.curve.batch_row_ms() is not None
    rng = np.random.default_rng(22)
    feeds = [{"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(80)]
    one_row = {"input": (1, 3, 32, 32)}

    def beside() -> bool:
        return switch.beside_batches(one_row, sched._sizer.curve.batch_row_ms(), explore=False)

    try:
        async with sched:
            results = [await sched.infer(feed) for feed in feeds[:MIN_RUNS + 1]]  # alone: the pool's runs
            await asyncio.to_thread(switch.wait_ready, 60.0)
            results += [await sched.infer(feed) for feed in feeds[MIN_RUNS + 1:2 * (MIN_RUNS + 1)]]
            for start in range(2 * (MIN_RUNS + 1), 48, 12):  # bursts: one-thread runs measured beside
                results += await asyncio.gather(*(sched.infer(feed) for feed in feeds[start:min(48, start + 12)]))
            before, lone_before = beside(), sched.counters["batch_size:1"]
            results += await asyncio.gather(*(sched.infer(feed) for feed in feeds[48:]))
            after, lone = beside(), sched.counters["batch_size:1"] - lone_before  # runs of one row in the burst
    finally:
        sched.discard()
        model.close()
    assert_like_ort(proto, feeds, results, "probabilities")
    if before and after:
        assert lone >= 16, sched.counters  # most of the 32 rows alone, one thread each
    elif not before and not after:
        assert lone <= 8, sched.counters  # most rows in batches
