"""PlanExecutor: tensors handed stage to stage and freed early; run-time fallback to cpu.

A stage failure is injected into the accelerator's executables (BackendError,
or a crash of another type); the request must still get the ONNX Runtime
answer, and the fallback must be counted, logged and reported.
"""

from __future__ import annotations

import logging

import pytest

from backends.errors import BackendError
from edge_runtime.planning.executor import FallbackKey
from planning_fakes import assert_close_to, chain, feeds_for, ort_outputs, skip_dag


@pytest.fixture
def gpu_plan(make_planner, options):
    """A gpu plan of the chain with cpu islands: restricted, cpu, restricted, cpu, restricted."""
    model = chain()
    planner, accel, host = make_planner(model, refuse_ops=("Relu",), input_shapes={"x": (64, 256)})
    executor = planner.compile(planner.layout("gpu"), options)
    assert [s.backend for s in executor.stages] == ["restricted", "cpu", "restricted", "cpu", "restricted"]
    return model, executor, accel, host


def test_intermediates_are_dropped_once_no_later_stage_needs_them(make_planner, options) -> None:
    model = skip_dag()
    planner, _, _ = make_planner(model, refuse_nodes=("relu1", "gate_mul", "tanh_aux"),
                              input_shapes={"x": (32, 4, 8, 8)})
    executor = planner.compile(planner.layout("gpu"), options)
    assert len(executor.stages) >= 3
    env = dict(feeds_for(model, 2))
    outputs = {"logits", "aux"}
    for k in range(len(executor.stages)):
        executor.advance(k, env, [])
        needed_later = {t for stage in executor.stages[k + 1:] for t in stage.spec.inputs}
        produced_so_far = {t for stage in executor.stages[:k + 1] for t in stage.spec.outputs} | {"x"}
        assert set(env) == (needed_later | outputs) & produced_so_far, f"after stage {k}"
    assert set(env) == outputs


def test_a_failing_accelerator_stage_reruns_on_cpu_and_is_counted(gpu_plan, caplog) -> None:
    model, executor, accel, host = gpu_plan
    feeds = feeds_for(model, 3)
    compiles_before = len(host.compiled)
    accel.fail_runs = 1  # the first accelerator stage fails on this request
    with caplog.at_level(logging.WARNING, logger="edge_runtime.planning.executor"):
        result = executor.run_reporting(feeds)
    assert_close_to(result.outputs, ort_outputs(model, feeds))
    assert executor.fallbacks == {FallbackKey("stage0", "restricted", "BackendError"): 1}
    assert result.fallback is not None and "stage 0 (restricted) re-ran on cpu: BackendError" in result.fallback
    assert executor.last_fallback == result.fallback
    assert any("stage 0 on restricted failed" in r.getMessage() for r in caplog.records)
    assert len(host.compiled) == compiles_before + 1, "the cpu version of the stage is compiled on need"
    # The next request runs on the accelerator again: nothing falls back, nothing recompiles.
    assert_close_to(executor.run(feeds), ort_outputs(model, feeds))
    assert executor.last_fallback is None
    assert sum(executor.fallbacks.values()) == 1 and len(host.compiled) == compiles_before + 1


def test_every_accelerator_stage_failing_still_answers(gpu_plan) -> None:
    model, executor, accel, host = gpu_plan
    feeds = feeds_for(model, 2, seed=4)
    accel.fail_runs = 3
    assert_close_to(executor.run(feeds), ort_outputs(model, feeds))
    assert executor.fallbacks == {FallbackKey(f"stage{k}", "restricted", "BackendError"): 1 for k in (0, 2, 4)}
    assert executor.describe()["fallbacks"][0] == {"stage": "stage0", "backend": "restricted",
                                                   "reason": "BackendError", "count": 1}


def test_a_backend_crashing_outside_the_contract_also_falls_back(gpu_plan) -> None:
    model, executor, accel, _ = gpu_plan
    feeds = feeds_for(model, 2)
    accel.raise_type = RuntimeError
    accel.fail_runs = 1
    assert_close_to(executor.run(feeds), ort_outputs(model, feeds))
    assert executor.fallbacks == {FallbackKey("stage0", "restricted", "unexpected RuntimeError"): 1}


def test_a_failing_cpu_stage_is_an_error_not_a_silent_answer(gpu_plan) -> None:
    model, executor, _, host = gpu_plan
    host.fail_runs = 1
    with pytest.raises(BackendError, match="injected failure"):
        executor.run(feeds_for(model, 2))
    assert not executor.fallbacks


def test_pipelined_requests_fall_back_too(gpu_plan) -> None:
    model, executor, accel, _ = gpu_plan
    requests = [feeds_for(model, batch, seed=i) for i, batch in enumerate((1, 2, 3, 4, 5))]
    accel.fail_runs = 2
    for feeds, got in zip(requests, executor.run_many(requests)):
        assert_close_to(got, ort_outputs(model, feeds))
    assert sum(executor.fallbacks.values()) == 2


def test_backend_nodes_and_describe_cover_every_stage(gpu_plan) -> None:
    model, executor, _, _ = gpu_plan
    assert executor.backend_nodes == {"restricted": 3, "cpu": 2}
    described = executor.describe()
    assert described["plan"] == "gpu" and described["backend"] == "restricted+cpu"
    assert [s["backend"] for s in described["stages"]] == [s.backend for s in executor.stages]
    assert described["est_ms"] > 0


@pytest.mark.requires_opencl
def test_a_failing_opencl_stage_reruns_on_cpu_and_is_counted(make_planner, options, opencl_backend) -> None:
    model = skip_dag()
    planner, accel, _ = make_planner(model, refuse_nodes=("sigmoid",), inner=opencl_backend, name="opencl",
                                     input_shapes={"x": (32, 4, 8, 8)})
    executor = planner.compile(planner.layout("gpu"), options)
    assert executor.stages[0].backend == "opencl"
    feeds = feeds_for(model, 2)
    accel.fail_runs = 1
    result = executor.run_reporting(feeds)
    assert_close_to(result.outputs, ort_outputs(model, feeds))
    assert executor.fallbacks == {FallbackKey("stage0", "opencl", "BackendError"): 1}
    assert result.fallback is not None and "stage 0 (opencl)" in result.fallback
