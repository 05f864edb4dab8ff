"""Cost model: bound shapes against the shapes ONNX Runtime really produces, FLOPs of
the heavy ops against their textbook count on those shapes, and speed arithmetic."""

from __future__ import annotations

import math
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from planning_fakes import chain, ocr_models, skip_dag


def observed_shapes(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Shape of every node output as ONNX Runtime computes it (all intermediates exposed)."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    have = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        for name in node.output:
            if name and name not in have:
                exposed.graph.output.append(helper.make_empty_tensor_value_info(name))
                have.add(name)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(exposed.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return {name: tuple(value.shape) for name, value in zip(names, session.run(names, feeds))}


@pytest.mark.parametrize("batch", [1, 5])
def test_bound_shapes_equal_the_shapes_onnxruntime_produces(batch: int) -> None:
    from edge_runtime.planning.cost import bound_tensor_specs

    model = skip_dag()
    feeds = {"x": np.zeros((batch, 4, 8, 8), np.float32)}
    specs = bound_tensor_specs(model, {"x": feeds["x"].shape})
    for name, shape in observed_shapes(model, feeds).items():
        assert specs[name].shape == shape, name


@pytest.mark.skipif("rec" not in ocr_models() and os.environ.get("CI") != "true",
                    reason="rapidocr-onnxruntime (test extra) is not installed")
def test_bound_shapes_of_a_real_exported_transformer_match_onnxruntime() -> None:
    """PP-OCR rec reshapes to computed shapes, where onnx inference alone loses track: what it
    tells must be right, and the probe run on the cpu backend fills the rest."""
    from backends.cpu import CPUBackend
    from edge_runtime.planning.cost import bound_tensor_specs
    from edge_runtime.planning.graph import prepare

    path = ocr_models().get("rec")
    assert path is not None, "PP-OCR rec model not found in rapidocr_onnxruntime"
    model = prepare(onnx.load(str(path))).model
    x = np.random.default_rng(0).random((2, 3, 48, 128), dtype=np.float32)
    observed = observed_shapes(model, {"x": x})
    inferred = bound_tensor_specs(model, {"x": x.shape})
    known = [name for name in observed if name in inferred and inferred[name].is_static()]
    assert len(known) >= 0.5 * len(observed)
    assert all(inferred[name].shape == observed[name] for name in known)
    probed = bound_tensor_specs(model, {"x": x.shape}, probe=CPUBackend())
    assert {name: probed[name].shape for name in observed} == observed


def test_flops_of_conv_matmul_and_gemm_are_the_textbook_count() -> None:
    from edge_runtime.planning.cost import bound_tensor_specs, node_cost

    for model, feeds in ((skip_dag(), {"x": np.zeros((3, 4, 8, 8), np.float32)}),
                         (chain(width=32), {"x": np.zeros((6, 32), np.float32)})):
        specs = bound_tensor_specs(model, {k: v.shape for k, v in feeds.items()})
        shapes = observed_shapes(model, feeds)
        weights = {init.name: tuple(init.dims) for init in model.graph.initializer}
        shapes.update(weights)
        shapes.update({k: v.shape for k, v in feeds.items()})
        for node in model.graph.node:
            cost = node_cost(node, specs)
            out = shapes[node.output[0]]
            assert cost.conv == (node.op_type == "Conv")
            if node.op_type == "Conv":
                c_out, c_in, kh, kw = weights[node.input[1]]
                assert cost.flops == 2 * math.prod(out) * c_in * kh * kw
            elif node.op_type in ("MatMul", "Gemm"):
                k = shapes[node.input[0]][-1]
                assert cost.flops == 2 * math.prod(out) * k
            in_bytes = sum(4 * math.prod(shapes[i]) for i in node.input)
            out_bytes = sum(4 * math.prod(shapes[o]) for o in node.output)
            if node.op_type not in ("Flatten",):  # a view: no traffic
                assert cost.mem_bytes == in_bytes + out_bytes, node.name


def test_dynamic_dims_bind_to_given_shapes_and_shared_names_agree() -> None:
    from backends.base import TensorSpec
    from edge_runtime.planning.cost import DEFAULT_DIM, bound_input_shapes

    inputs = [TensorSpec("a", "float32", ("batch", 3, "h", "w")), TensorSpec("b", "float32", ("batch", "h")),
              TensorSpec("c", "float32", (None, "?", 7))]
    shapes = bound_input_shapes(inputs, {"a": (4, 3, 32, 48)})
    assert shapes["a"] == (4, 3, 32, 48)
    assert shapes["b"] == (4, 32), "a symbolic name takes the size it has in a given input"
    assert shapes["c"] == (1, DEFAULT_DIM, 7)


def test_copy_and_node_time_follow_the_roofline() -> None:
    from edge_runtime.planning.cost import BackendSpeed, NodeCost

    device = BackendSpeed("gpu", gflops=100.0, mem_gbps=50.0, launch_us=10.0, stage_us=30.0,
                          copy_gbps=4.0, copy_latency_us=25.0)
    host = BackendSpeed("cpu", gflops=100.0, mem_gbps=50.0, launch_us=10.0, stage_us=30.0)
    assert host.copy_s(1 << 20) == 0.0, "the host does not copy to itself"
    assert device.copy_s(4_000_000) == pytest.approx(1e-3 + 25e-6)
    assert device.copy_s(0) == pytest.approx(25e-6), "latency is paid even for an empty tensor"
    compute_bound = NodeCost(flops=1e9, mem_bytes=1e6)
    memory_bound = NodeCost(flops=1e6, mem_bytes=1e9)
    assert device.node_s(compute_bound) == pytest.approx(1e9 / 100e9 + 10e-6)
    assert device.node_s(memory_bound) == pytest.approx(1e9 / 50e9 + 10e-6)
    conv_device = BackendSpeed("gpu", gflops=100.0, mem_gbps=50.0, launch_us=10.0, stage_us=30.0, conv_gflops=10.0)
    conv = NodeCost(flops=1e9, mem_bytes=1e6, conv=True)
    assert conv_device.node_s(conv) == pytest.approx(1e9 / 10e9 + 10e-6), "convolutions at their own speed"
    assert device.node_s(conv) == device.node_s(compute_bound), "no conv speed: the matmul speed"
    with pytest.raises(ValueError, match="implausible"):
        BackendSpeed.from_dict({**device.to_dict(), "gflops": 0.0})
    assert BackendSpeed.from_dict(device.to_dict()) == device


def test_a_plan_is_re_estimated_for_another_batch_size(make_planner) -> None:
    model = skip_dag()
    at_one, _, _ = make_planner(model, refuse_nodes=("sigmoid",), input_shapes={"x": (1, 4, 8, 8)})
    at_eight, _, _ = make_planner(model, refuse_nodes=("sigmoid",), input_shapes={"x": (8, 4, 8, 8)})
    plan = at_one.layout("gpu")
    at_batch_8 = at_one.estimate_ms(plan, {"x": (8, 4, 8, 8)})
    # The load-time binding does not matter, only the sizes asked for.
    assert at_eight.estimate_ms(plan, {"x": (8, 4, 8, 8)}) == pytest.approx(at_batch_8)
    assert at_one.estimate_ms(plan, {"x": (1, 4, 8, 8)}) == pytest.approx(plan.partition.latency_s * 1e3)
    assert at_batch_8 > plan.partition.latency_s * 1e3
