"""An idle model's lone short request runs on the event loop (``scheduler/inline.py``); others in workers.

Oracle: plain ONNX Runtime for every answer. Which thread ran each request is read from the
instrumented plan (the test's own thread is the loop's), so the tests see where a run went,
not how fast it was.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from edge_runtime.errors import BackendError, ConfigError
from edge_runtime.scheduler import ModelScheduler, model_config
from edge_runtime.scheduler.factory import scheduler_for, serving_options
from scheduler_fakes import InstrumentedPlan, assert_like_ort, ort_oracle

THINK_S = 0.05  # a client's pause between two requests: arrivals far slower than a run of the mlp
LENIENT = {"inline_max_ms": 50.0}  # a stalled test machine's first run must not keep the mlp off the loop


def _served(exe, scheduler: dict, **plan_options) -> tuple[ModelScheduler, InstrumentedPlan]:
    plan = InstrumentedPlan("cpu", exe, **plan_options)
    config = model_config({"scheduler": scheduler, "batching": {"max_batch_size": 8, "max_queue_delay_us": 2000}})
    return ModelScheduler("mlp", exe.inputs, {"cpu": plan}, config, outputs=exe.outputs), plan


def _feeds(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"input": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(count)]


async def _one_at_a_time(sched: ModelScheduler, feeds: list[dict[str, np.ndarray]]) -> list:
    results = []
    for feed in feeds:
        results.append(await sched.infer(feed))
        await asyncio.sleep(THINK_S)
    return results


async def test_lone_requests_on_an_idle_model_run_on_the_loop_and_equal_onnxruntime(mlp_cpu, mlp_proto) -> None:
    sched, plan = _served(mlp_cpu, LENIENT)
    feeds = _feeds(6, 1)
    async with sched:
        results = await _one_at_a_time(sched, feeds)
    loop_thread = threading.get_ident()
    # The first run is in a worker: nothing says yet how long a run takes. Then each on the loop.
    assert plan.threads[0] != loop_thread
    assert plan.threads[1:] == [loop_thread] * 5
    assert sched.stats()["inline"] == 5
    oracle = ort_oracle(mlp_proto)
    for feed, result in zip(feeds, results):
        np.testing.assert_allclose(result.outputs["logits"], oracle(feed)["logits"], rtol=1e-5, atol=1e-6)
        assert result.batch_size == 1 and result.plan == "cpu"


async def test_a_burst_runs_no_request_on_the_loop_and_batches(mlp_cpu, mlp_proto) -> None:
    sched, plan = _served(mlp_cpu, LENIENT)
    async with sched:
        await _one_at_a_time(sched, _feeds(2, 2))  # measured, and the last one ran on the loop
        before = len(plan.threads)
        burst = _feeds(16, 3)
        results = await asyncio.gather(*(sched.infer(feed) for feed in burst))
    loop_thread = threading.get_ident()
    # The burst's requests are all waiting on the loop when the first is decided: none runs there.
    assert plan.threads[before:].count(loop_thread) == 0, plan.threads[before:]
    assert max(result.batch_size for result in results) > 1, "the burst was never batched"
    oracle = ort_oracle(mlp_proto)
    for feed, result in zip(burst, results):
        np.testing.assert_allclose(result.outputs["logits"], oracle(feed)["logits"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scheduler", [{"inline_max_ms": 0}, {"inline_max_ms": 1e-6}],
                         ids=["turned-off", "runs-longer-than-the-bound"])
async def test_no_run_goes_on_the_loop_when_off_or_when_runs_are_longer(mlp_cpu, scheduler) -> None:
    sched, plan = _served(mlp_cpu, scheduler)
    async with sched:
        await _one_at_a_time(sched, _feeds(4, 4))
    assert threading.get_ident() not in plan.threads
    assert "inline" not in sched.stats()


async def test_a_failing_run_on_the_loop_answers_its_error_and_frees_the_device(mlp_cpu) -> None:
    sched, plan = _served(mlp_cpu, LENIENT)
    async with sched:
        await _one_at_a_time(sched, _feeds(2, 5))
        plan.fail = True
        with pytest.raises(BackendError, match="device lost"):
            await sched.infer(_feeds(1, 6)[0])
        assert plan.threads[-1] == threading.get_ident()  # that run was on the loop
        plan.fail = False
        await asyncio.sleep(THINK_S)
        result = await sched.infer(_feeds(1, 7)[0])  # the slot was given back
    assert result.outputs["logits"].shape[0] == 1
    assert sched.stats()["failures"] == 1


async def test_default_configuration_runs_a_served_cnn_s_lone_requests_on_the_loop(runtime, cnn) -> None:
    """What the daemon does: the factory's scheduler, default settings (2 ms bound), real measured costs."""
    path, proto = cnn
    config = model_config({"batching": {"max_batch_size": 8}})
    model = runtime.load(path, backend="cpu", options=serving_options(runtime, config))
    sched = scheduler_for(model, config, runtime, None)
    rng = np.random.default_rng(9)
    feeds = [{"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(8)]
    try:
        async with sched:
            results = await _one_at_a_time(sched, feeds)
            one_row_ms = sched.stats()["cost_ms_per_row"].get(1)
    finally:
        model.close()
    assert_like_ort(proto, feeds, results, "probabilities")
    if one_row_ms is not None and one_row_ms <= 2.0:  # this machine runs the CNN under the default bound
        assert sched.stats().get("inline", 0) >= 1, sched.stats()
    else:  # a machine too slow for the bound keeps it off the loop
        assert "inline" not in sched.stats(), (one_row_ms, sched.stats())


@pytest.mark.parametrize("bad, message", [
    (-1, r"inline_max_ms must be in 0\.\.50 \(milliseconds\), got -1"),
    (51, r"inline_max_ms must be in 0\.\.50 \(milliseconds\), got 51"),
    ("fast", r"inline_max_ms: expected float, got 'fast'"),
])
def test_inline_bound_outside_its_range_is_a_config_error(bad, message) -> None:
    with pytest.raises(ConfigError, match=message):
        model_config({"scheduler": {"inline_max_ms": bad}})
