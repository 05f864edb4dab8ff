"""Real models on the vulkan backend against ONNX Runtime / LiteRT on the CPU (fp32, 1e-4 relative).

PaddleOCR's CNNs come from the ``rapidocr-onnxruntime`` wheel (test extra),
MediaPipe's float32 ``.tflite`` models from the mediapipe 0.10.14 wheel named
by ``EDGE_RUNTIME_TEST_MEDIAPIPE`` (see tests/backends/tflite). Kept to small
models: every first shader compile costs 15-30 s on lavapipe.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from backends.base import CompileOptions
from edge_runtime.config import runtime_config
from edge_runtime.runtime import Runtime

# NOTE: a cold first shader compile of a real model takes 15-30 s on an idle lavapipe and up to
# ~4 min on a loaded 2-core box; the suite-wide 300 s timeout is for hangs, not for this.
pytestmark = [pytest.mark.requires_vulkan, pytest.mark.timeout(900)]
IN_CI = os.environ.get("CI", "").lower() == "true"


def _ocr(kind: str) -> Path:
    from tests.planning.planning_fakes import ocr_models

    found = ocr_models()
    if kind not in found:
        if IN_CI:
            pytest.fail(f"PP-OCR {kind} model not found in rapidocr_onnxruntime (CI=true)")
        pytest.skip("rapidocr-onnxruntime (test extra) is not installed")
    return found[kind]


def _ort_cpu(path_or_proto, feeds):
    import onnxruntime as ort

    source = path_or_proto if isinstance(path_or_proto, (str, Path)) else path_or_proto.SerializeToString()
    session = ort.InferenceSession(str(source) if isinstance(source, Path) else source,
                                   providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _close(got, want):
    for name, expected in want.items():
        scale = float(np.max(np.abs(expected))) or 1.0
        np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-4 * scale, err_msg=name)


@pytest.fixture
def runtime(tmp_path, vk_backend):
    rt = Runtime(runtime_config(env={"EDGE_RUNTIME_CACHE": str(tmp_path / "cache")}))
    rt._backends["vulkan"] = (vk_backend, vk_backend.availability())  # one canary per session
    yield rt
    rt.close()


def test_paddleocr_classifier_runs_whole_on_vulkan_like_ort_cpu(runtime) -> None:
    path = _ocr("cls")
    model = runtime.load(path, backend="vulkan")
    assert model.backend_nodes == {"vulkan": len(onnx.load(path).graph.node)}  # all 157 nodes on the EP
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32)
    _close(model.run({"x": x}), _ort_cpu(path, {"x": x}))
    described = model.describe()["executable"]
    assert described["precision"]["mode"] == "fp32" and described["adapter"] and described["driver"]
    assert described["api"].startswith("Vulkan ")
    model.close()


def _mediapipe(name: str, tmp_path_factory) -> Path:
    from tests.backends.tflite.test_tflite_mediapipe import _from_package, _from_wheels

    found = _from_package()
    source = os.environ.get("EDGE_RUNTIME_TEST_MEDIAPIPE")
    if name not in found and source:
        found.update(_from_wheels(Path(source), tmp_path_factory.mktemp("mp")))
    if name not in found:
        if IN_CI:
            pytest.fail(f"{name}: no mediapipe 0.10.x models (CI=true: .ci/run provides them)")
        pytest.skip("no mediapipe 0.10.x models: set EDGE_RUNTIME_TEST_MEDIAPIPE")
    return found[name]


@pytest.mark.requires_litert
@pytest.mark.parametrize("name", ["hand_recrop.tflite", "iris_landmark.tflite"])
def test_mediapipe_tflite_on_the_litert_gpu_accelerator_like_litert_cpu(runtime, name, tmp_path_factory) -> None:
    from ai_edge_litert.interpreter import Interpreter

    path = _mediapipe(name, tmp_path_factory)
    model = runtime.load(path, backend="vulkan")
    interpreter = Interpreter(model_path=str(path))
    assert model.backend_nodes == {"vulkan": len(interpreter._get_ops_details())}  # the model's ops
    interpreter.allocate_tensors()
    assert model.describe()["executable"]["fully_accelerated"] is True
    rng = np.random.default_rng(1)
    feeds = {s.name: rng.uniform(-1, 1, s.shape).astype(np.float32) for s in model.inputs}
    for detail in interpreter.get_input_details():
        interpreter.set_tensor(detail["index"], feeds[detail["name"]])
    interpreter.invoke()
    want = {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}
    _close(model.run(feeds), want)
    model.close()


def _model_with_a_refused_node(refused: bool = True) -> onnx.ModelProto:
    """Three Conv→Relu blocks, then Celu: the WebGPU EP (0.4.0) has no Celu kernel, ORT's CPU EP has."""
    rng = np.random.default_rng(2)
    weights, nodes, previous = [], [], "x"
    for i, (cin, cout) in enumerate([(8, 16), (16, 16), (16, 16)]):
        weights.append(numpy_helper.from_array(rng.standard_normal((cout, cin, 3, 3)).astype(np.float32) * 0.2, f"w{i}"))
        nodes += [helper.make_node("Conv", [previous, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        previous = f"r{i}"
    nodes.append(helper.make_node("Celu" if refused else "Elu", [previous], ["y"], name="tail"))
    graph = helper.make_graph(nodes, "refused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32, 32])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_node_the_ep_refuses_runs_as_a_vulkan_plus_cpu_plan(runtime, vk_backend, tmp_path) -> None:
    from backends.errors import UnsupportedNodesError
    from backends.onnx_graph import tensor_specs

    proto = _model_with_a_refused_node()
    path = tmp_path / "refused.onnx"
    onnx.save(proto, path)
    specs = tensor_specs(proto)
    assert [vk_backend.supports(n, specs) for n in proto.graph.node] == [True] * 6 + [False]
    with pytest.raises(UnsupportedNodesError, match="Celu"):
        runtime.load(path, backend="vulkan")
    runtime._backends.pop("opencl", None)
    runtime.match = type(runtime.match)(runtime.match.name, runtime.match.reasons, ("vulkan", "cpu"),
                                        runtime.match.hints)  # this device's order, as a vgpu phone's
    model = runtime.load(path, plan="gpu")
    assert set(model.backend.split("+")) == {"vulkan", "cpu"}
    assert model.backend_nodes == {"vulkan": 6, "cpu": 1}
    x = np.random.default_rng(3).uniform(-1, 1, (1, 8, 32, 32)).astype(np.float32)
    _close(model.run({"x": x}), _ort_cpu(proto, {"x": x}))
    model.close()


def test_fp16_on_request_reports_its_measured_drift(vk_backend) -> None:
    proto = _model_with_a_refused_node(refused=False)
    executable = vk_backend.compile(proto, CompileOptions(precision="fp16", intra_op_threads=1))
    drift = executable.describe()["precision"]
    assert drift["mode"] == "fp16" and drift["drift"]["measured"] is True
    assert 0.0 < drift["drift"]["max_abs"] < 0.05  # fp16 rounding: not zero, not wild
    executable.close()


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cli_run_json_reports_placement_and_precision(tmp_path, precision) -> None:
    import json
    import subprocess
    import sys

    path = tmp_path / "convs.onnx"
    onnx.save(_model_with_a_refused_node(refused=False), path)
    env = {**os.environ, "EDGE_RUNTIME_CACHE": str(tmp_path / "cache"), "EDGE_RUNTIME_PRECISION": precision,
           "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, "-m", "edge_runtime", "run", str(path), "--backend", "vulkan", "--json",
                           "--repeat", "2"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["backend"] == "vulkan" and result["backend_nodes"] == {"vulkan": 7}
    assert result["precision"]["mode"] == precision
    if precision == "fp16":
        assert result["precision"]["drift"]["measured"] is True and result["precision"]["drift"]["max_abs"] > 0
    else:
        assert "drift" not in result["precision"]
    assert result["load"]["executable"]["shader_cache"]["path"]


def test_the_grouped_conv_the_ep_computes_wrong_is_refused(vk_backend) -> None:
    """When an EP release fixes it, this fails: then drop placement.known_wrong's Conv rule."""
    import onnxruntime as ort

    from backends.onnx_graph import tensor_specs
    from backends.vulkan import webgpu
    from tests.backends.op_cases import case_inputs

    model, feeds = case_inputs("conv_groups2")  # 6 -> 10 channels in 2 groups
    assert not vk_backend.supports(model.graph.node[0], tensor_specs(model))
    raw = ort.InferenceSession(model.SerializeToString(), webgpu.session_options(1, False)).run(None, feeds)[0]
    want = _ort_cpu(model, feeds)["y"]
    assert float(np.max(np.abs(raw - want))) > 1e-2  # the EP's own result is wrong
