"""Device workers: the cpu and gpu workers run at once; one device never runs more than its slots.

Plans run the mlp on the ``cpu`` backend (ONNX Runtime); the ``gpu`` plan is a
stand-in (a second ONNX Runtime session placed on the gpu worker).
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from edge_runtime.scheduler import DeviceWorkers, ModelScheduler, cpu_split, model_config
from scheduler_fakes import InstrumentedPlan


@pytest.mark.parametrize("cores, runs, threads", [(1, 1, 1), (2, 1, 2), (4, 1, 4), (6, 1, 6), (8, 2, 4), (16, 4, 4)])
def test_cpu_split_rule(cores: int, runs: int, threads: int) -> None:
    split = cpu_split(cores)
    assert (split.concurrent_runs, split.intra_op_threads) == (runs, threads)


async def test_cpu_and_gpu_workers_run_concurrently(mlp_cpu, mlp_gpu_standin) -> None:
    barrier = threading.Barrier(2)  # both runs must be inside their plans at the same time
    plans = {"cpu": InstrumentedPlan("cpu", mlp_cpu), "gpu": InstrumentedPlan("gpu", mlp_gpu_standin, device="gpu")}
    for plan in plans.values():
        plan.barrier = barrier
    sched = ModelScheduler("mlp", mlp_cpu.inputs, plans, model_config({}), workers=DeviceWorkers(cpu_cores=2))
    x = np.ones((1, 64), np.float32)
    async with sched:
        results = await asyncio.gather(sched.infer({"input": x}, plan="cpu"), sched.infer({"input": x}, plan="gpu"))
    assert [r.plan for r in results] == ["cpu", "gpu"]


class _Tracker:
    def __init__(self) -> None:
        self.lock, self.active, self.peak = threading.Lock(), 0, 0


class _TrackedPlan(InstrumentedPlan):
    def __init__(self, tracker: _Tracker, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tracker = tracker

    def run(self, feeds):
        with self.tracker.lock:
            self.tracker.active += 1
            self.tracker.peak = max(self.tracker.peak, self.tracker.active)
        try:
            return super().run(feeds)
        finally:
            with self.tracker.lock:
                self.tracker.active -= 1


@pytest.mark.parametrize("cores, peak", [(2, 1), (8, 2)])
async def test_models_sharing_a_device_respect_its_slots(mlp_cpu, mlp_gpu_standin, cores: int, peak: int) -> None:
    tracker, workers = _Tracker(), DeviceWorkers(cpu_cores=cores)
    schedulers = [ModelScheduler(f"m{i}", mlp_cpu.inputs,
                                 {"cpu": _TrackedPlan(tracker, "cpu", exe, delay_s=0.02)}, model_config({}),
                                 workers=workers)
                  for i, exe in enumerate((mlp_cpu, mlp_gpu_standin))]
    x = np.ones((1, 64), np.float32)
    for sched in schedulers:
        await sched.start()
    await asyncio.gather(*(s.infer({"input": x}) for s in schedulers for _ in range(4)))
    for sched in schedulers:
        await sched.close()
    assert tracker.peak == peak
    workers.close()


async def test_the_worker_takes_its_next_batch_itself_while_the_event_loop_is_busy(mlp_cpu) -> None:
    """Three queued requests all run while the loop is blocked: no run waits for the loop to dispatch it."""
    from scheduler_fakes import hold_worker

    plan = InstrumentedPlan("cpu", mlp_cpu)
    sched = ModelScheduler("mlp", mlp_cpu.inputs, {"cpu": plan}, model_config({}), workers=DeviceWorkers(cpu_cores=2))
    x = np.ones((1, 64), np.float32)
    async with sched:
        first = await hold_worker(sched, plan, {"input": x})
        queued = [asyncio.ensure_future(sched.infer({"input": x * k})) for k in (2, 3)]
        await asyncio.sleep(0)  # let both reach the queue
        assert sched.pending == 2
        plan.gate.set()
        # Block the event loop until all three ran: only the worker thread can dispatch them now.
        deadline = threading.Event()
        for _ in range(3000):
            if len(plan.calls) == 3:
                break
            deadline.wait(0.01)
        assert len(plan.calls) == 3, f"{len(plan.calls)} run(s) while the loop was busy: the worker waited for it"
        results = await asyncio.gather(first, *queued)
    assert [r.batch_size for r in results] == [1, 1, 1]
