"""Dynamic batching: each request gets exactly its rows, equal to running it alone.

Oracle: a plain ONNX Runtime session running each request alone. Plans run
the model on the ``cpu`` backend (ONNX Runtime). Models: the zoo's mlp,
mobilenet-style CNN and transformer block (dynamic batch), and a tiny model
built here with a symbolic trailing dimension.
"""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from backends.base import TensorSpec
from edge_runtime.scheduler import BatchingConfig, DeviceWorkers, ModelScheduler, model_config
from edge_runtime.scheduler.batch_probe import declared_batch_dim
from edge_runtime.scheduler.batching import BatchSizer, split_outputs
from scheduler_fakes import InstrumentedPlan, compile_on, hold_worker, ort_oracle, wait_until

ZOO = {"mlp": {"image_size": None}, "mobilenet": {"image_size": 32}, "transformer": {"image_size": None}}


def _zoo(name: str) -> onnx.ModelProto:
    from edge_runtime.model_zoo import BUILDERS

    size = ZOO[name]["image_size"]
    return BUILDERS[name](image_size=size) if size else BUILDERS[name]()


def _feed(exe, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    spec = exe.inputs[0]
    return {spec.name: rng.standard_normal((rows, *spec.shape[1:])).astype(np.float32)}


def _batched(exe, **batching) -> ModelScheduler:
    plan = InstrumentedPlan("cpu", exe)
    return ModelScheduler("m", exe.inputs, {"cpu": plan}, model_config({"batching": batching}), outputs=exe.outputs)


@pytest.mark.parametrize("name", sorted(ZOO))
async def test_batched_results_equal_each_request_run_alone(name: str) -> None:
    proto = _zoo(name)
    exe, oracle = compile_on("cpu", proto), ort_oracle(proto)
    rng = np.random.default_rng(42)
    feeds = [_feed(exe, int(rng.integers(1, 4)), rng) for _ in range(12)]
    sched = _batched(exe, max_batch_size=8, max_queue_delay_us=20_000)
    async with sched:
        results = await asyncio.gather(*(sched.infer(f, request_id=str(i)) for i, f in enumerate(feeds)))
    assert sched.batching
    for i, (feed, result) in enumerate(zip(feeds, results)):
        rows = next(iter(feed.values())).shape[0]
        expected = oracle(feed)
        assert result.request_id == str(i) and result.plan == "cpu"
        assert set(result.outputs) == set(expected)
        for out, want in expected.items():
            assert result.outputs[out].shape == want.shape  # exactly its own rows
            np.testing.assert_allclose(result.outputs[out], want, rtol=1e-5, atol=1e-5)
        assert rows <= result.batch_size <= 8
    assert max(r.batch_size for r in results) > 3, "requests were never batched together"
    for a, b in itertools.combinations(results, 2):  # no request can reach another's data
        for out in a.outputs:
            assert not np.shares_memory(a.outputs[out], b.outputs[out])
    stats = sched.stats()
    assert sum(n for k, n in stats.items() if k.startswith("batch_size:")) < len(feeds)


def _softmax_model() -> onnx.ModelProto:
    """Y = Softmax(X, axis=-1) with X [batch, n]: the trailing size varies per request."""
    node = helper.make_node("Softmax", ["X"], ["Y"], axis=-1)
    graph = helper.make_graph([node], "softmax_rows",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", "n"])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", "n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


async def test_requests_with_different_trailing_shapes_are_never_mixed() -> None:
    proto = _softmax_model()
    exe, oracle = compile_on("cpu", proto), ort_oracle(proto)
    rng = np.random.default_rng(7)
    feeds = [{"X": rng.standard_normal((int(rng.integers(1, 3)), n)).astype(np.float32)}
             for n in (3, 5, 3, 5, 5, 3, 3, 5)]
    plan = InstrumentedPlan("cpu", exe)
    sched = ModelScheduler("softmax", exe.inputs, {"cpu": plan},
                           # A long delay: a stall of the loaded test machine must not flush a partial batch.
                           model_config({"batching": {"max_batch_size": 16, "max_queue_delay_us": 300_000}}),
                           outputs=exe.outputs)
    async with sched:
        results = await asyncio.gather(*(sched.infer(f) for f in feeds))
    for feed, result in zip(feeds, results):
        np.testing.assert_allclose(result.outputs["Y"], oracle(feed)["Y"], rtol=1e-6, atol=1e-7)
        same_width_rows = sum(f["X"].shape[0] for f in feeds if f["X"].shape[1] == feed["X"].shape[1])
        assert result.batch_size <= same_width_rows
    # Every run holds one width (a request alone when the model was idle, then those gathered meanwhile).
    assert {call["X"].shape[1] for call in plan.calls} == {3, 5}
    assert sum(call["X"].shape[0] for call in plan.calls) == sum(f["X"].shape[0] for f in feeds)
    assert len(plan.calls) < len(feeds)  # and some of them were joined


def _busy_batched(exe, **batching) -> tuple[ModelScheduler, InstrumentedPlan]:
    """A batching scheduler with two cpu run slots, so a request can find the model busy and a slot free:
    ``hold_worker(sched, held, ..., plan="held")`` keeps a run of the model in flight on the second plan."""
    plans = {"cpu": InstrumentedPlan("cpu", exe), "held": InstrumentedPlan("held", exe)}
    return ModelScheduler("m", exe.inputs, plans, model_config({"batching": batching}), outputs=exe.outputs,
                          workers=DeviceWorkers(cpu_cores=8), default_plan="cpu"), plans["held"]


async def _hold(sched: ModelScheduler, held: InstrumentedPlan, feeds: dict) -> "asyncio.Task":
    """A request held inside plan ``held`` (the model is busy; the other cpu slot is free)."""
    held.gate.clear()
    task = asyncio.create_task(sched.infer(feeds, plan="held"))
    await wait_until(lambda: sched.in_flight == 1)
    return task


async def test_a_lone_request_on_an_idle_model_does_not_wait_for_company(mlp_cpu) -> None:
    sched = _batched(mlp_cpu, max_batch_size=8, max_queue_delay_us=5_000_000)
    async with sched:
        result = await asyncio.wait_for(sched.infer({"input": np.ones((1, 64), np.float32)}), timeout=3.0)
    assert result.batch_size == 1


async def test_behind_a_running_batch_a_lone_request_waits_at_most_the_queue_delay(mlp_cpu) -> None:
    sched, plan = _busy_batched(mlp_cpu, max_batch_size=8, max_queue_delay_us=30_000)
    x = np.ones((1, 64), np.float32)
    async with sched:
        held = await _hold(sched, plan, {"input": x})
        result = await sched.infer({"input": x * 2})  # a slot is free, but the model is busy: it waits
        plan.gate.set()
        await held
    assert result.batch_size == 1
    assert 25.0 <= result.queue_ms <= 30.0 + 150.0  # the delay, plus scheduling noise


async def test_full_batch_goes_without_waiting_for_the_delay(mlp_cpu) -> None:
    sched, plan = _busy_batched(mlp_cpu, max_batch_size=4, max_queue_delay_us=5_000_000)
    async with sched:
        held = await _hold(sched, plan, {"input": np.zeros((1, 64), np.float32)})
        results = await asyncio.wait_for(asyncio.gather(
            *(sched.infer({"input": np.full((1, 64), i, np.float32)}) for i in range(4))), timeout=3.0)
        plan.gate.set()
        await held
    assert [r.batch_size for r in results] == [4] * 4


async def test_batch_takes_the_highest_priorities_first(mlp_cpu) -> None:
    plan = InstrumentedPlan("cpu", mlp_cpu)
    sched = ModelScheduler("mlp", mlp_cpu.inputs, {"cpu": plan},
                           model_config({"batching": {"max_batch_size": 2, "max_queue_delay_us": 1000}}),
                           outputs=mlp_cpu.outputs)
    inputs = {p: np.full((1, 64), p, np.float32) for p in (1, 2, 3, 4)}
    async with sched:
        first = await hold_worker(sched, plan, {"input": np.zeros((1, 64), np.float32)})
        tasks = [asyncio.create_task(sched.infer({"input": inputs[p]}, priority=p)) for p in (1, 3, 2, 4)]
        await wait_until(lambda: sched.pending == 4)
        plan.gate.set()
        await asyncio.gather(first, *tasks)
    assert [sorted(call["input"][:, 0].tolist()) for call in plan.calls[1:]] == [[3.0, 4.0], [1.0, 2.0]]


async def test_model_without_batch_dimension_runs_requests_alone(mlp_proto) -> None:
    fixed = onnx.ModelProto()
    fixed.CopyFrom(mlp_proto)
    for value in (*fixed.graph.input, *fixed.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = 1
    exe = compile_on("cpu", fixed)
    sched = _batched(exe, max_batch_size=8, max_queue_delay_us=20_000)
    async with sched:
        results = await asyncio.gather(*(sched.infer({"input": np.full((1, 64), i, np.float32)}) for i in range(3)))
    assert not sched.batching and [r.batch_size for r in results] == [1, 1, 1]


async def test_adaptive_limit_shrinks_when_runs_exceed_the_latency_target(mlp_cpu) -> None:
    class RowCostPlan(InstrumentedPlan):
        def run(self, feeds):  # a device whose run time grows 10 ms per row
            self.delay_s = 0.01 * feeds["input"].shape[0]
            return super().run(feeds)

    plan = RowCostPlan("cpu", mlp_cpu)
    sched = ModelScheduler("mlp", mlp_cpu.inputs, {"cpu": plan},
                           model_config({"batching": {"max_batch_size": 8, "max_queue_delay_us": 2000,
                                                      "latency_target_ms": 25}}), outputs=mlp_cpu.outputs)
    async with sched:
        for _ in range(3):
            await asyncio.gather(*(sched.infer({"input": np.ones((1, 64), np.float32)}) for _ in range(8)))
    assert sched.stats()["batch_limit"] <= 3
    assert max(call["input"].shape[0] for call in plan.calls[-4:]) <= 3


def test_batch_sizer_prefers_configured_sizes_and_aimd_stays_in_bounds() -> None:
    sizer = BatchSizer(BatchingConfig(max_batch_size=8, preferred_batch_sizes=(2, 4)))
    assert not sizer.ready(3) and sizer.ready(4)
    assert sizer.take([1, 1, 1, 1, 1]) == 4  # the longest run that sums to a preferred size
    assert sizer.take([3, 2, 2]) == 3  # 7 rows: no preferred sum, the longest that fits
    assert sizer.take([9, 1]) == 1  # larger than the limit: runs alone
    aimd = BatchSizer(BatchingConfig(max_batch_size=8, latency_target_ms=10))
    aimd.observe(8, 25.0)
    assert aimd.limit == 4
    aimd.observe(4, 5.0)
    assert aimd.limit == 5
    for _ in range(10):
        aimd.observe(aimd.limit, 1.0)
    assert aimd.limit == 8
    for _ in range(10):
        aimd.observe(1, 99.0)
    assert aimd.limit == 1
    fixed = BatchSizer(BatchingConfig(max_batch_size=8))
    fixed.observe(8, 1e6)
    assert fixed.limit == 8


def test_split_outputs_copies_rows_and_rejects_outputs_without_batch_rows() -> None:
    out = {"y": np.arange(10, dtype=np.float32).reshape(5, 2)}
    parts = split_outputs(out, [2, 3])
    assert [p["y"].tolist() for p in parts] == [[[0, 1], [2, 3]], [[4, 5], [6, 7], [8, 9]]]
    assert all(not np.shares_memory(p["y"], out["y"]) for p in parts)
    with pytest.raises(Exception, match="output 'y' has shape \\[5, 2\\], expected 4 rows"):
        split_outputs(out, [2, 2])
    assert declared_batch_dim([TensorSpec("x", "float32", ("batch", 4))], [TensorSpec("y", "float32", (1,))]) == \
        "dim 0 of 'y' is fixed at 1"
