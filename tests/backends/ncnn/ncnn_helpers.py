"""Small ONNX models and ONNX Runtime comparisons for the ncnn tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def conv_model(seed: int = 0, quantise: bool = False, middle_op: str | None = None,
               dynamic: bool = False) -> onnx.ModelProto:
    """Conv -> Relu -> [middle] -> Conv -> Add(skip): input ``x`` [N, 4, 16, 16].

    ``quantise`` adds Cast(float->int64->float), which pnnx leaves as an
    unmapped ``Tensor.to``; ``middle_op`` inserts a unary op there (``Erf``
    for a node the plan test keeps off ncnn). ``dynamic`` makes H and W symbolic.
    """
    dims = ["N", 4, "H", "W"] if dynamic else ["N", 4, 16, 16]
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((4, 8, 3, 3)) * 0.3).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1")]
    previous = "r1"
    if quantise:
        nodes += [helper.make_node("Cast", ["r1"], ["q"], to=TensorProto.INT64, name="to_int"),
                  helper.make_node("Cast", ["q"], ["r1q"], to=TensorProto.FLOAT, name="to_float")]
        previous = "r1q"
    if middle_op:
        nodes.append(helper.make_node(middle_op, [previous], ["mid"], name="middle"))
        previous = "mid"
    nodes += [helper.make_node("Conv", [previous, "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
              helper.make_node("Add", ["c2", "x"], ["y"], name="skip")]
    graph = helper.make_graph(nodes, "conv_block",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def ort_outputs(model: onnx.ModelProto | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    """Within 1e-4 relative of ONNX Runtime (absolute 1e-4 of the output's scale for values near 0)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = max(1.0, float(np.max(np.abs(want))))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)
