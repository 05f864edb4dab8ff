"""Pipelined execution (``run_many``): stages of consecutive requests overlap, results keep order."""

from __future__ import annotations

import threading
import time

import pytest

from backends.errors import BackendError
from planning_fakes import assert_close_to, chain, feeds_for, ort_outputs


@pytest.fixture
def slow_plan(make_planner, options):
    """restricted, cpu, restricted, cpu, restricted; each restricted run sleeps (like a GPU kernel)."""
    model = chain(width=64)
    planner, accel, host = make_planner(model, refuse_ops=("Relu",), input_shapes={"x": (256, 64)})
    executor = planner.compile(planner.layout("gpu"), options)
    assert [s.backend for s in executor.stages] == ["restricted", "cpu", "restricted", "cpu", "restricted"]
    return model, executor, accel, host


def test_stages_of_consecutive_requests_overlap(slow_plan) -> None:
    model, executor, accel, _ = slow_plan
    requests = [feeds_for(model, 2, seed=i) for i in range(6)]
    executor.run_many(requests[:1])  # warm-up
    delay_s = 0.04
    accel.run_delay_s = delay_s
    start = time.perf_counter()
    for feeds in requests:
        executor.run(feeds)
    sequential_s = time.perf_counter() - start
    start = time.perf_counter()
    results = executor.run_many(requests)
    pipelined_s = time.perf_counter() - start
    for feeds, got in zip(requests, results):
        assert_close_to(got, ort_outputs(model, feeds))
    # Sequential: 6 requests x 3 sleeping stages. Pipelined: each sleeping stage still sleeps
    # 6 times, but the three of them sleep at the same time.
    assert sequential_s >= 6 * 3 * delay_s
    assert 6 * delay_s <= pipelined_s < 0.7 * sequential_s, (pipelined_s, sequential_s)


def test_results_keep_request_order_and_no_thread_outlives_the_call(slow_plan) -> None:
    model, executor, _, _ = slow_plan
    requests = [feeds_for(model, batch, seed=i) for i, batch in enumerate((5, 1, 4, 2, 3))]
    threads_before = threading.active_count()
    results = executor.run_many(requests)
    assert [r["y"].shape[0] for r in results] == [5, 1, 4, 2, 3]
    for feeds, got in zip(requests, results):
        assert_close_to(got, ort_outputs(model, feeds))
    assert threading.active_count() == threads_before
    assert executor.run_many([]) == []


def test_an_unrecoverable_failure_is_raised_after_the_pipeline_drains(slow_plan) -> None:
    model, executor, _, host = slow_plan
    threads_before = threading.active_count()
    host.fail_runs = 1  # a cpu stage has no fallback
    with pytest.raises(BackendError, match="injected failure"):
        executor.run_many([feeds_for(model, 2, seed=i) for i in range(4)])
    assert threading.active_count() == threads_before
    # The executor is still usable afterwards.
    feeds = feeds_for(model, 2)
    assert_close_to(executor.run(feeds), ort_outputs(model, feeds))
