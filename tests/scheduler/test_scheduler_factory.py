"""``scheduler_for``: plans, policy and shared workers for a model loaded by a real ``Runtime``.

The oracle is ``Model.run`` on the same file (the runtime's own path, no scheduler).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from edge_runtime.errors import ConfigError
from edge_runtime.scheduler import model_config
from edge_runtime.scheduler.factory import monitor_for, runtime_workers, scheduler_for
from edge_runtime.scheduler.plans import GPU_BACKENDS
from scheduler_fakes import InstrumentedPlan, compile_on, ort_oracle, pool_model


@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory: pytest.TempPathFactory, mlp_proto) -> Path:
    path = tmp_path_factory.mktemp("models") / "mlp.onnx"
    onnx.save(mlp_proto, str(path))
    return path


async def test_adaptive_policy_gets_cpu_and_any_usable_gpu_plan(runtime, mlp_path, mlp_proto) -> None:
    model = runtime.load(mlp_path, backend="cpu")
    monitor = monitor_for(runtime)
    sched = scheduler_for(model, model_config({"scheduler": {"policy": "threshold"}}), runtime, monitor)
    assert "cpu" in sched.plans
    assert all(set(sched.plans[n].backends) <= GPU_BACKENDS for n in sched.plans if n != "cpu")
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    async with sched:
        result = await sched.infer({"input": x})
    assert result.plan in sched.plans
    np.testing.assert_allclose(result.outputs["logits"], ort_oracle(mlp_proto)({"input": x})["logits"],
                               rtol=1e-4, atol=1e-5)


async def test_model_on_another_backend_gains_a_cpu_plan_unless_fixed(runtime, mlp_path, mlp_proto) -> None:
    model = runtime.load(mlp_path, backend="null")  # the do-nothing backend as "the model's own"
    fixed = scheduler_for(model, model_config({}), runtime, None)
    assert list(fixed.plans) == ["null"]
    adaptive = scheduler_for(model, model_config({"scheduler": {"policy": "cost", "explore_fraction": 0.0}}),
                             runtime, None)
    assert {"null", "cpu"} <= set(adaptive.plans)
    x = np.ones((2, 64), np.float32)
    async with adaptive:
        result = await adaptive.infer({"input": x}, plan="cpu")
    assert result.backends == ("cpu",)
    np.testing.assert_allclose(result.outputs["logits"], ort_oracle(mlp_proto)({"input": x})["logits"],
                               rtol=1e-4, atol=1e-5)
    with pytest.raises(ConfigError, match="plan 'tpu' is not a plan"):
        scheduler_for(model, model_config({"scheduler": {"plan": "tpu"}}), runtime, None)


async def test_extra_hybrid_plan_is_taken_when_the_gpu_is_busy(runtime, mlp_path, mlp_proto) -> None:
    model = runtime.load(mlp_path, backend="cpu")
    hybrid = InstrumentedPlan("hybrid", compile_on("cpu", mlp_proto), backends=("opencl", "cpu"))  # stand-in
    monitor = monitor_for(runtime)
    monitor.pin(gpu_busy=0.95)
    sched = scheduler_for(model, model_config({"scheduler": {"policy": "threshold"}}), runtime, monitor,
                          extra_plans={"hybrid": hybrid})
    async with sched:
        result = await sched.infer({"input": np.ones((1, 64), np.float32)})
    assert result.plan == "hybrid" and len(hybrid.calls) == 1


def test_models_of_one_runtime_share_device_workers(runtime, mlp_path) -> None:
    a = scheduler_for(runtime.load(mlp_path, backend="cpu"), model_config({}), runtime, None)
    b = scheduler_for(runtime.load(mlp_path, name="other", backend="cpu"), model_config({}), runtime, None)
    assert runtime_workers(runtime) is runtime_workers(runtime)
    assert a._workers is b._workers is runtime_workers(runtime)
    assert runtime_workers(runtime).cpu.intra_op_threads == 2


@pytest.mark.requires_opencl
async def test_an_adaptive_policy_serves_the_partitioners_hybrid_plan_where_it_finds_one(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.model_zoo import build_mobilenet
    from edge_runtime.planning.cost import BackendSpeed
    from edge_runtime.runtime import Runtime

    folder = tmp_path_factory.mktemp("hybrid")
    proto = build_mobilenet()
    onnx.save(proto, str(folder / "mobilenet.onnx"))
    rt = Runtime(RuntimeConfig(cache_dir=folder / "cache", intra_op_threads=2))  # OpenCL (PoCL in CI) probed
    # Whether the pipeline cut pays depends on the calibrated speeds, which a busy 2-core machine
    # measures anywhere from balanced to lopsided; pin them balanced, with cheap copies, so the
    # partitioner finds a two-backend cut and this test is about the scheduler serving it.
    speeds = {"cpu": BackendSpeed("cpu", gflops=10.0, mem_gbps=10.0, launch_us=5.0, stage_us=20.0),
              "opencl": BackendSpeed("opencl", gflops=10.0, mem_gbps=10.0, launch_us=5.0, stage_us=20.0,
                                     copy_gbps=100.0, copy_latency_us=1.0)}
    monkeypatch.setattr(rt, "backend_speed", lambda name: speeds[name])
    try:
        model = rt.load(folder / "mobilenet.onnx", backend="cpu")
        sched = scheduler_for(model, model_config({"scheduler": {"policy": "threshold"}}), rt, None)
        assert "hybrid" in sched.plans, sorted(sched.plans)
        assert {"cpu", "opencl"} <= set(sched.plans["hybrid"].backends)
        x = np.random.default_rng(2).standard_normal((1, 3, 64, 64)).astype(np.float32)
        async with sched:
            result = await sched.infer({"input": x}, plan="hybrid")
        assert result.plan == "hybrid" and result.fallback is None
        np.testing.assert_allclose(result.outputs["probabilities"],
                                   ort_oracle(proto)({"input": x})["probabilities"], rtol=1e-3, atol=1e-4)
    finally:
        rt.close()


def _session_entry(plan, key: str) -> str:
    session = pool_model(plan).executable._session  # the ONNX Runtime session behind the plan
    return session.get_session_options().get_session_config_entry(key)


def test_served_onnxruntime_sessions_spin_only_while_a_run_is_in_flight(runtime, mlp_path) -> None:
    from edge_runtime.scheduler.factory import serving_options

    spinning = runtime.load(mlp_path, backend="cpu")  # the library default: ORT's threads spin after runs too
    assert spinning.options.allow_spinning and not spinning.options.spin_only_in_runs
    for model in (spinning, runtime.load(mlp_path, backend="cpu", options=serving_options(runtime))):
        sched = scheduler_for(model, model_config({"scheduler": {"policy": "cost"}}), runtime, None)
        options = pool_model(sched.plans["cpu"]).options
        assert options.allow_spinning and options.spin_only_in_runs
        assert _session_entry(sched.plans["cpu"], "session.intra_op.allow_spinning") == "1"
        assert _session_entry(sched.plans["cpu"], "session.force_spinning_stop") == "1"
        sched.discard()
