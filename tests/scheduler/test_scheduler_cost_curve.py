"""Batch sizing from the measured cost curve (``cost_curve.py``, ``BatchSizer``, ``measure_cost_curve``).

The curve's rules are checked on curves given by hand (their definition is the
oracle: knee = smallest size within 10 % of the best per-row cost; cap = the best
size when every larger measured size is dearer by more than that). Through a real
scheduler: a batch goes as soon as it reaches the knee, a capped curve splits a deep
queue into batches no larger than the cap, and every request's answer equals plain
ONNX Runtime's on that request alone. The load-time measurement runs the real model.
"""

from __future__ import annotations

import asyncio

import numpy as np

from edge_runtime.scheduler import BatchingConfig, DeviceWorkers, ModelScheduler, model_config
from edge_runtime.scheduler.batch_probe import BatchingDecision, decide_batching, measure_cost_curve
from edge_runtime.scheduler.batching import BatchSizer
from edge_runtime.scheduler.cost_curve import EXPLORE_EVERY, MIN_RUNS, CostCurve
from scheduler_fakes import InstrumentedPlan, compile_on, ort_oracle, wait_until

# Per-row ms of the PP-OCR classifier measured in the issue (2 cores, spinning threads).
OCR_CURVE = {1: 1.10, 4: 0.65, 8: 0.54, 16: 0.57}


def test_a_batch_row_is_the_best_known_batch_once_a_batch_of_the_reach_is_known() -> None:
    assert CostCurve(16, OCR_CURVE).batch_row_ms() == 0.54  # the best of 4, 8, 16 (a lone row is no batch)
    assert CostCurve(16, {1: 1.0, 2: 0.9, 4: 0.8}).batch_row_ms() is None  # no batch of 8 rows known yet
    assert CostCurve(4, {1: 1.0, 2: 0.9, 4: 0.8}).batch_row_ms() == 0.8  # 4 rows: the largest batch taken
    live = CostCurve(16)
    for _ in range(MIN_RUNS - 1):
        live.observe(8, 8 * 0.5)
    assert live.batch_row_ms() is None  # seen, not known
    live.observe(8, 8 * 0.5)
    assert live.batch_row_ms() == 0.5


def test_knee_is_the_smallest_size_within_the_margin_of_the_best() -> None:
    assert CostCurve(16, OCR_CURVE).knee() == 8  # 16 is within 10 % of 8's 0.54, but 8 is smaller
    assert CostCurve(16, {1: 1.0, 2: 0.95}).knee() == 1
    assert CostCurve(16, {4: 1.0}).knee() is None  # one size says nothing about the curve
    assert CostCurve(16).knee() is None


def test_cap_only_where_larger_batches_are_measured_dearer_per_row() -> None:
    assert CostCurve(16, OCR_CURVE).cap() is None  # 16 rows cost about what 8 do: no reason to stop at 8
    assert CostCurve(16, {**OCR_CURVE, 16: 0.65}).cap() is None  # 14 % dearer: within the cap's margin
    assert CostCurve(16, {**OCR_CURVE, 16: 0.80}).cap() == 8
    curve = CostCurve(16, {1: 1.0})
    for _ in range(30):  # live runs move the EWMA towards what the runs take
        curve.observe(8, 8 * 0.5)
    assert abs(curve.per_row_ms()[8] - 0.5) < 1e-6 and curve.knee() == 8


def test_a_size_seen_in_a_few_live_runs_only_decides_nothing() -> None:
    curve = CostCurve(16, {1: 1.0})
    for _ in range(MIN_RUNS - 1):  # a slow moment: 2-row runs look dearer per row than 1-row ones
        curve.observe(2, 2 * 3.0)
    assert curve.cap() is None and curve.knee() is None
    curve.observe(2, 2 * 3.0)
    assert curve.cap() == 1  # now it is known
    curve.observe(32, 1.0)  # beyond max_rows: ignored
    curve.observe(4, 0.0)  # not a time: ignored
    assert set(curve.per_row_ms()) == {1, 2}


def test_sizer_is_ready_at_the_knee_and_takes_no_more_than_the_cap() -> None:
    sizer = BatchSizer(BatchingConfig(max_batch_size=16), {**OCR_CURVE, 16: 0.80})
    assert not sizer.ready(7) and sizer.ready(8)
    assert sizer.take([1] * 12) == 8
    plain = BatchSizer(BatchingConfig(max_batch_size=16))  # no curve: as before
    assert not plain.ready(8) and plain.ready(16) and plain.take([1] * 12) == 12


def test_the_cap_is_lifted_for_one_batch_in_every_explore_period() -> None:
    sizer = BatchSizer(BatchingConfig(max_batch_size=16), {**OCR_CURVE, 16: 0.80})
    takes = []
    for _ in range(EXPLORE_EVERY):
        takes.append(sizer.take([1] * 16))
        sizer.observe(takes[-1], takes[-1] * 0.54)
    assert takes.count(16) == 1 and takes.count(8) == EXPLORE_EVERY - 1


def test_load_time_measurement_times_the_real_model_at_powers_of_two(mlp_cpu) -> None:
    shapes = {"input": (1, 64)}
    curve = measure_cost_curve(mlp_cpu.run, mlp_cpu.inputs, shapes, max_rows=8)
    assert [rows for rows, _ in curve] == [1, 2, 4, 8]
    assert all(ms > 0 for _, ms in curve)
    decision = decide_batching(BatchingConfig(max_batch_size=8), mlp_cpu.inputs, mlp_cpu.outputs, mlp_cpu.run,
                               [shapes])
    assert decision.enabled and [rows for rows, _ in decision.cost_ms_per_row] == [1, 2, 4, 8]
    assert set(decision.to_dict()["cost_ms_per_row"]) == {"1", "2", "4", "8"}


def _scheduler(exe, curve: dict[int, float], **batching) -> tuple[ModelScheduler, dict[str, InstrumentedPlan]]:
    """Two cpu slots (a held run keeps the model busy on ``held`` while ``cpu`` is free)."""
    plans = {"cpu": InstrumentedPlan("cpu", exe), "held": InstrumentedPlan("held", exe)}
    decision = BatchingDecision(True, "test", batching["max_batch_size"],
                                cost_ms_per_row=tuple(sorted(curve.items())))
    sched = ModelScheduler("m", exe.inputs, plans, model_config({"batching": batching}), outputs=exe.outputs,
                           workers=DeviceWorkers(cpu_cores=8), default_plan="cpu", batching=decision)
    return sched, plans


async def test_a_forming_batch_goes_at_the_knee_without_waiting_for_the_delay(mlp_cpu) -> None:
    sched, plans = _scheduler(mlp_cpu, {1: 1.0, 2: 0.7, 4: 0.5, 8: 0.49}, max_batch_size=8,
                              max_queue_delay_us=5_000_000)
    x = np.ones((1, 64), np.float32)
    async with sched:
        plans["held"].gate.clear()
        held = asyncio.create_task(sched.infer({"input": x}, plan="held"))
        await wait_until(lambda: sched.in_flight == 1)
        results = await asyncio.wait_for(asyncio.gather(
            *(sched.infer({"input": x * i}, plan="cpu") for i in range(4))), timeout=3.0)
        plans["held"].gate.set()
        await held
    assert sched.stats()["batch_knee"] == 4
    assert [r.batch_size for r in results] == [4] * 4  # the knee, long before the 5 s delay


async def test_capped_batches_still_answer_each_request_with_its_own_rows(mlp_proto) -> None:
    exe, oracle = compile_on("cpu", mlp_proto), ort_oracle(mlp_proto)
    sched, plans = _scheduler(exe, {1: 1.0, 4: 0.5, 8: 0.9}, max_batch_size=8, max_queue_delay_us=2000)
    rng = np.random.default_rng(11)
    feeds = [{"input": rng.standard_normal((int(rng.integers(1, 3)), 64)).astype(np.float32)} for _ in range(20)]
    async with sched:
        plans["held"].gate.clear()
        held = asyncio.create_task(sched.infer(feeds[0], plan="held"))
        await wait_until(lambda: sched.in_flight == 1)
        tasks = [asyncio.create_task(sched.infer(f, plan="cpu")) for f in feeds]
        plans["held"].gate.set()
        results = await asyncio.gather(*tasks)
        await held
    for feed, result in zip(feeds, results):
        np.testing.assert_allclose(result.outputs["logits"], oracle(feed)["logits"], rtol=1e-5, atol=1e-5)
    sizes = [call["input"].shape[0] for call in plans["cpu"].calls]
    assert sum(sizes) == sum(f["input"].shape[0] for f in feeds)
    assert max(sizes) <= 4 and len(sizes) < len(feeds)  # capped at 4 rows, and still batched
