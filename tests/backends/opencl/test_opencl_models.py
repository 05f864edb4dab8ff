"""Whole models on the OpenCL backend vs ONNX Runtime CPU (1e-4 relative), all nodes on opencl."""

from __future__ import annotations

import numpy as np
import pytest

from backends.base import CompileOptions
from make_models import build_mlp, build_mobilenet, build_transformer
from opencl_helpers import assert_close, ort_outputs

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
    for batch in (1, 2):
        _check(executable, model, {"tokens": rng.standard_normal((batch, 16, 64)).astype(np.float32)})
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
