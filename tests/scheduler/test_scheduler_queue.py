"""Queueing: deadlines (expired requests never run), bounded queue, priorities, a free event loop.

Plans run the mlp on the ``cpu`` backend (ONNX Runtime); outputs are checked
against a plain ONNX Runtime session run on each request alone.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from edge_runtime.errors import DeadlineExceededError, EdgeRuntimeError, InvalidInputError, QueueFullError
from edge_runtime.scheduler import ModelScheduler, model_config
from scheduler_fakes import InstrumentedPlan, hold_worker, ort_oracle, ran, wait_until


def _x(seed: int, rows: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)


def _scheduler(exe, plan, **config) -> ModelScheduler:
    return ModelScheduler("mlp", exe.inputs, {"cpu": plan}, model_config(config), outputs=exe.outputs)


async def test_request_past_its_deadline_is_answered_with_timeout_and_never_run(mlp_cpu, mlp_proto) -> None:
    plan = InstrumentedPlan("cpu", mlp_cpu)
    sched = _scheduler(mlp_cpu, plan)
    late = _x(2)
    async with sched:
        first = await hold_worker(sched, plan, {"input": _x(1)})
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError, match="deadline"):
            await sched.infer({"input": late}, timeout_ms=50)
        waited_s = time.monotonic() - started
        plan.gate.set()
        result = await first
        # A request queued after the deadline must not run either (the dispatcher drops it).
        assert (await sched.infer({"input": _x(3)})).plan == "cpu"
    assert 0.04 <= waited_s < 2.0
    assert not ran(plan, "input", late), "an expired request reached the plan"
    assert len(plan.calls) == 2
    np.testing.assert_allclose(result.outputs["logits"], ort_oracle(mlp_proto)({"input": _x(1)})["logits"],
                               rtol=1e-5, atol=1e-6)
    assert sched.stats()["deadline_exceeded"] == 1


async def test_default_timeout_from_config_expires_queued_requests(mlp_cpu) -> None:
    plan = InstrumentedPlan("cpu", mlp_cpu)
    sched = _scheduler(mlp_cpu, plan, queue={"default_timeout_ms": 40})
    queued = [_x(10 + i) for i in range(3)]
    async with sched:
        first = await hold_worker(sched, plan, {"input": _x(9)}, timeout_ms=10_000)
        outcomes = await asyncio.gather(*(sched.infer({"input": x}) for x in queued), return_exceptions=True)
        plan.gate.set()
        await first
    assert all(isinstance(o, DeadlineExceededError) for o in outcomes)
    assert not any(ran(plan, "input", x) for x in queued)
    assert sched.stats()["deadline_exceeded"] == 3


async def test_full_queue_rejects_at_once_with_a_distinct_error(mlp_cpu) -> None:
    plan = InstrumentedPlan("cpu", mlp_cpu)
    sched = _scheduler(mlp_cpu, plan, queue={"max_queue_size": 2})
    async with sched:
        first = await hold_worker(sched, plan, {"input": _x(1)})
        queued = [asyncio.create_task(sched.infer({"input": _x(2 + i)})) for i in range(2)]
        await wait_until(lambda: sched.pending == 2)
        started = time.monotonic()
        with pytest.raises(QueueFullError, match="queue full") as caught:
            await sched.infer({"input": _x(9)})
        assert time.monotonic() - started < 0.5  # immediate, not after a wait
        assert not isinstance(caught.value, DeadlineExceededError)
        plan.gate.set()
        results = await asyncio.gather(first, *queued)
    assert [r.plan for r in results] == ["cpu"] * 3
    assert not ran(plan, "input", _x(9))
    stats = sched.stats()
    assert stats["rejected_queue_full"] == 1 and stats["success"] == 3


async def test_cancelled_waiters_do_not_hold_queue_slots(mlp_cpu) -> None:
    plan = InstrumentedPlan("cpu", mlp_cpu)
    sched = _scheduler(mlp_cpu, plan, queue={"max_queue_size": 2})
    async with sched:
        first = await hold_worker(sched, plan, {"input": _x(1)})
        for i in range(5):  # callers that give up keep the queue bounded and usable
            with pytest.raises(DeadlineExceededError):
                await sched.infer({"input": _x(20 + i)}, timeout_ms=5)
        assert sched.pending <= 2
        follow_up = asyncio.create_task(sched.infer({"input": _x(30)}))
        plan.gate.set()
        await first
        assert (await follow_up).plan == "cpu"


async def test_higher_priority_runs_first_and_equal_priorities_keep_arrival_order(mlp_cpu) -> None:
    plan = InstrumentedPlan("cpu", mlp_cpu)
    sched = _scheduler(mlp_cpu, plan)
    priorities = [0, 5, 1, 5, 9, 0]
    inputs = [_x(100 + i) for i in range(len(priorities))]
    async with sched:
        first = await hold_worker(sched, plan, {"input": _x(99)})
        tasks = [asyncio.create_task(sched.infer({"input": x}, priority=p)) for x, p in zip(inputs, priorities)]
        await wait_until(lambda: sched.pending == len(priorities))
        plan.gate.set()
        await asyncio.gather(first, *tasks)
    order = [next(i for i, x in enumerate(inputs) if np.array_equal(call["input"], x)) for call in plan.calls[1:]]
    assert order == [4, 1, 3, 2, 0, 5]


async def test_bad_input_is_rejected_before_queueing(mlp_cpu) -> None:
    plan = InstrumentedPlan("cpu", mlp_cpu)
    sched = _scheduler(mlp_cpu, plan)
    async with sched:
        with pytest.raises(InvalidInputError, match="'input'.*dimension 1 must be 64"):
            await sched.infer({"input": np.zeros((1, 63), np.float32)})
        with pytest.raises(EdgeRuntimeError, match="no plan 'gpu'"):
            await sched.infer({"input": _x(1)}, plan="gpu")
    assert plan.calls == [] and sched.pending == 0


async def test_event_loop_keeps_running_while_a_plan_computes(mlp_cpu) -> None:
    plan = InstrumentedPlan("cpu", mlp_cpu, delay_s=0.5)
    sched = _scheduler(mlp_cpu, plan)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    async with sched:
        beat = asyncio.create_task(ticker())
        await sched.infer({"input": _x(1)})
        beat.cancel()
    assert ticks >= 10  # ~100 possible in 0.5 s; a blocked loop would give 0 or 1


async def test_legacy_choose_plan_hook_and_close_drains(mlp_cpu, mlp_gpu_standin) -> None:
    cpu = InstrumentedPlan("cpu", mlp_cpu)
    other = InstrumentedPlan("other", mlp_gpu_standin)
    sched = ModelScheduler("mlp", mlp_cpu.inputs, {"cpu": cpu, "other": other}, model_config({}),
                           None, lambda plans, entry: "other")
    await sched.start()
    tasks = [asyncio.create_task(sched.infer({"input": _x(i)})) for i in range(4)]
    await asyncio.sleep(0)
    await sched.close(drain_timeout_s=10)
    assert [t.result().plan for t in tasks] == ["other"] * 4
    assert cpu.calls == [] and len(other.calls) == 4
    with pytest.raises(EdgeRuntimeError, match="shutting down"):
        await sched.infer({"input": _x(1)})
