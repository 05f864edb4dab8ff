"""Whole models on the OpenCL backend vs ONNX Runtime CPU (1e-4 relative), all nodes on opencl."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from backends.base import CompileOptions
from make_models import build_mlp, build_mobilenet, build_transformer
from tests.backends.model_helpers import assert_close, make_model, ort_outputs, rand, tensor

pytestmark = pytest.mark.requires_opencl


def _check(executable, model, feeds) -> None:
    got = executable.run(feeds)
    want = ort_outputs(model, feeds)
    for spec, expected in zip(executable.outputs, want):
        assert_close(got[spec.name], expected, what=spec.name)


def test_mlp_dynamic_batch(ocl_backend) -> None:
    model = build_mlp()
    executable = ocl_backend.compile(model, CompileOptions())
    rng = np.random.default_rng(5)
    for batch in (1, 4):
        _check(executable, model, {"input": rng.standard_normal((batch, 64)).astype(np.float32)})
    assert executable.backend_nodes == {"opencl": len(model.graph.node)}
    fused = executable.describe()["specialisations"][0]["fused"]
    assert any("Gemm" in label and "Relu" in label for label in fused)


def test_mobilenet_batch_1_and_3(ocl_backend) -> None:
    model = build_mobilenet()
    executable = ocl_backend.compile(model, CompileOptions())
    rng = np.random.default_rng(6)
    for batch in (1, 3):
        _check(executable, model, {"input": rng.standard_normal((batch, 3, 64, 64)).astype(np.float32)})
    assert executable.backend_nodes == {"opencl": len(model.graph.node)}
    info = executable.describe()
    assert len(info["specialisations"]) == 2  # one per batch size
    spec = info["specialisations"][0]
    # Every BatchNormalization folds into its Conv, and the activations ride along.
    bn_count = sum(node.op_type == "BatchNormalization" for node in model.graph.node)
    assert sum("BatchNormalization" in label for label in spec["fused"]) == bn_count
    assert any("HardSwish" in label for label in spec["fused"])
    assert any("Clip" in label for label in spec["fused"])
    # The memory plan shares buffers between tensors whose lifetimes do not overlap.
    assert spec["buffer_bytes"]["planned"] < spec["buffer_bytes"]["naive"] / 2


def test_transformer_block(ocl_backend) -> None:
    model = build_transformer()
    executable = ocl_backend.compile(model, CompileOptions())
    rng = np.random.default_rng(7)
    _check(executable, model, {"tokens": rng.standard_normal((2, 16, 64)).astype(np.float32)})
    assert executable.backend_nodes == {"opencl": len(model.graph.node)}
    fused = executable.describe()["specialisations"][0]["fused"]
    # The Erf-form Gelu (Div, Erf, Add, Mul, Mul) becomes the epilogue of its MatMul+bias.
    assert any(label.count("(Mul)") == 2 and "(Erf)" in label and "(MatMul)" in label for label in fused)


def test_same_model_runs_from_threads(ocl_backend) -> None:
    from concurrent.futures import ThreadPoolExecutor

    model = build_mlp()
    executable = ocl_backend.compile(model, CompileOptions())
    rng = np.random.default_rng(8)
    feeds = [{"input": rng.standard_normal((2, 64)).astype(np.float32)} for _ in range(6)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(executable.run, feeds))
    for feed, got in zip(feeds, results):
        assert_close(got["logits"], ort_outputs(model, feed)[0])


def _const(name: str, value: object) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def test_exporter_patterns_fold_and_fuse(ocl_backend) -> None:
    """What PyTorch/Paddle exporters emit: Constant nodes, Conv+BN+decomposed HardSwish
    (x * Clip(x + 3, 0, 6) / 6), and a Resize whose sizes come from Shape->Gather->Concat.
    """
    rng = np.random.default_rng(12)
    nodes = [
        _const("three", np.float32(3.0)), _const("zero", np.float32(0.0)), _const("six", np.float32(6.0)),
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["bn"], name="bn"),
        helper.make_node("Add", ["bn", "three"], ["a3"], name="add3"),
        helper.make_node("Clip", ["a3", "zero", "six"], ["r6"], name="relu6"),
        helper.make_node("Mul", ["bn", "r6"], ["hm"], name="mul"),
        helper.make_node("Div", ["hm", "six"], ["hs"], name="div6"),
        helper.make_node("Shape", ["hs"], ["shape"]),
        _const("idx", np.array([0, 1], np.int64)),
        helper.make_node("Gather", ["shape", "idx"], ["nc"], axis=0),
        _const("hw", np.array([10, 14], np.int64)),
        helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
        helper.make_node("Resize", ["hs", "", "", "sizes"], ["y"], mode="nearest"),
    ]
    inits = {"w": rand(rng, 6, 3, 3, 3), "g": rand(rng, 6, low=0.5, high=1.5), "b": rand(rng, 6),
             "m": rand(rng, 6), "v": rand(rng, 6, low=0.5, high=1.5)}
    model = make_model(nodes, [tensor("x", ["batch", 3, 5, 7])], [tensor("y", None)], inits, opset=13)
    executable = ocl_backend.compile(model, CompileOptions())
    for batch in (1, 2):
        _check(executable, model, {"x": rand(rng, batch, 3, 5, 7)})
    spec = executable.describe()["specialisations"][0]
    # Conv+BN+HardSwish is one convolution kernel (after a padding copy), then the Resize.
    assert spec["kernel_families"] == {"layout.pad2d": 1, "conv.conv2d": 1, "resize.resize_nearest": 1}
    assert [label.split(" (")[0] for label in spec["fused"][0].split("+")] == [
        n.name for n in model.graph.node if n.op_type in ("Conv", "BatchNormalization", "Add", "Clip", "Mul", "Div")]
    assert spec["folded_nodes"] == 8  # 5 Constants, Shape, Gather, Concat
    assert executable.backend_nodes == {"opencl": len(model.graph.node)}
