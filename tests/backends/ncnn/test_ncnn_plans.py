"""ncnn in plans: a convex subgraph on ncnn with ORT for the rest; ``auto`` racing cpu and ncnn."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from backends.cpu import CPUBackend
from backends.ncnn import NcnnBackend
from edge_runtime.engine_choice import choose_engine
from edge_runtime.planning.cost import BackendSpeed
from edge_runtime.planning.plans import Planner
from ncnn_helpers import assert_close, conv_model, ort_outputs

pytestmark = pytest.mark.requires_ncnn


def test_subgraph_plan_ncnn_plus_cpu_equals_the_whole_model(options) -> None:
    proto = conv_model(seed=7, middle_op="Floor")  # Floor is not an ncnn op: the middle stays on cpu
    speeds = {"cpu": BackendSpeed("cpu", gflops=10, mem_gbps=10, launch_us=5, stage_us=20),
              "ncnn": BackendSpeed("ncnn", gflops=20, mem_gbps=10, launch_us=0, stage_us=0)}
    planner = Planner(proto, {"cpu": CPUBackend(), "ncnn": NcnnBackend()}, speeds, host="cpu", accelerator="ncnn")
    plan = planner.layout("gpu")
    assert [s.backend for s in plan.partition.stages] == ["ncnn", "cpu", "ncnn"]
    executor = planner.compile(plan, options)
    try:
        assert all(s.compile_note is None for s in executor.stages)  # every ncnn stage converted and gated
        x = np.random.default_rng(8).standard_normal((2, 4, 16, 16)).astype(np.float32) * 3
        run = executor.run_reporting({"x": x})
        assert run.fallback is None
        assert_close(run.outputs["y"], ort_outputs(proto, {"x": x})[0])
        assert executor.backend_nodes == {"ncnn": 4, "cpu": 1}
    finally:
        executor.close()


def test_auto_races_cpu_and_ncnn_and_remembers_the_choice(make_runtime, tmp_path, ncnn_cache, options) -> None:
    from edge_runtime.model_zoo import build_mobilenet

    proto = build_mobilenet()
    path = tmp_path / "mobilenet.onnx"
    onnx.save(proto, str(path))
    model = make_runtime().load(path, input_shapes={"input": (1, 3, 64, 64)})
    assert model.backend in ("cpu", "ncnn")
    reason = model.report.reason if model.backend == "ncnn" else dict(model.report.tried)["ncnn"]
    assert "measured faster" in reason and "cpu " in reason and "ncnn " in reason
    x = np.random.default_rng(9).standard_normal((1, 3, 64, 64)).astype(np.float32)
    assert_close(model.run({"input": x})["probabilities"], ort_outputs(proto, {"input": x})[0])
    engines = {"cpu": CPUBackend(), "ncnn": NcnnBackend()}
    rt = make_runtime()
    again = choose_engine(proto, engines, rt.compile_options(), {"input": (1, 3, 64, 64)}, rt.device_key(), ncnn_cache)
    assert again.from_cache and again.backend == model.backend
    other = choose_engine(proto, engines, rt.compile_options(), {"input": (2, 3, 64, 64)}, rt.device_key(), ncnn_cache)
    assert not other.from_cache and set(other.best_ms) == {"cpu", "ncnn"}  # another input size: measured anew


def test_auto_without_ncnn_in_the_order_does_not_race(make_runtime, tmp_path) -> None:
    path = tmp_path / "block.onnx"
    onnx.save(conv_model(), str(path))
    model = make_runtime(("cpu",)).load(path)
    assert model.backend == "cpu" and "ncnn" not in dict(model.report.tried)


def test_backend_order_override_is_typed_and_checked() -> None:
    from edge_runtime.config import runtime_config
    from edge_runtime.errors import ConfigError

    assert runtime_config(env={"EDGE_RUNTIME_BACKENDS": "ncnn, cpu"}).backend_order == ("ncnn", "cpu")
    with pytest.raises(ConfigError, match=r"unknown backend\(s\) \['npu'\]"):
        runtime_config({"backend_order": ["npu", "cpu"]}, env={})
