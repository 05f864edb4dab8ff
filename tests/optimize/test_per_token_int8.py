"""int8 MatMuls with per-token activation scales (``edge_runtime.optimize.per_token_int8``).

Oracles: the W8A8 arithmetic written out in numpy (per-column symmetric weights,
per-row symmetric activations, an exact integer product, both scales applied
after), run against what ONNX Runtime computes on the rewritten graph; the fp32
graph for the size of the error; onnxruntime's own ``quantize_dynamic`` to show
the per-tensor form a batch changes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_runtime.optimize.per_token_int8 import per_token_int8
from edge_runtime.optimize.quantize import Int8Settings, host_int8_settings

X86_VNNI = Int8Settings(activation_signed=False, reduce_range=False)
ARM = Int8Settings(activation_signed=True, reduce_range=False)
X86_NO_VNNI = Int8Settings(activation_signed=False, reduce_range=True)
HOST = host_int8_settings()  # what quantize uses on this machine (arm64 in .ci/aarch64: signed activations)
K, N = 96, 40


def two_layer_graph(opset: int = 17) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """x [rows, K] -> MatMul(w1) -> Relu -> MatMul(w2) and, from the same x, MatMul(w3): two MatMuls share
    an activation; one weight (w2) is also read by an Identity, which must keep its fp32 copy."""
    rng = np.random.default_rng(3)
    w = {"w1": rng.standard_normal((K, N)).astype(np.float32) * 0.1,
         "w2": rng.standard_normal((N, N)).astype(np.float32) * 0.1,
         "w3": rng.standard_normal((K, N)).astype(np.float32) * 0.1}
    w["w3"][:, 5] = 0  # an all-zero column: its scale must not turn it into NaN
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"]), helper.make_node("MatMul", ["x", "w3"], ["z"]),
             helper.make_node("Identity", ["w2"], ["w2copy"])]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "z", "w2copy")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", K])],
                              outputs, [numpy_helper.from_array(v, k) for k, v in w.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), w


def run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def w8a8(x: np.ndarray, w: np.ndarray, limit: float) -> np.ndarray:
    """The oracle: per-row activation and per-column weight scales, integer product in int64."""
    col = np.maximum(np.abs(w).max(axis=0) / limit, 1e-30)
    wq = np.clip(np.round(w / col), -limit, limit).astype(np.int64)
    row = np.maximum(np.abs(x).max(axis=-1, keepdims=True) / 127, 1e-30)
    xq = np.round(x / row).astype(np.int64)
    return (xq @ wq).astype(np.float32) * row.astype(np.float32) * col.astype(np.float32)


def activations(rows: int = 5) -> np.ndarray:
    x = np.random.default_rng(9).standard_normal((rows, K)).astype(np.float32)
    x[1] *= 40  # a row of outliers
    x[2] = 0  # an all-zero row
    return x


@pytest.mark.aarch64  # the integer kernels of this CPU compute the same arithmetic
@pytest.mark.parametrize("settings", [X86_VNNI, ARM, X86_NO_VNNI, HOST],
                         ids=["u8-x86-vnni", "s8-arm", "u8-7bit", "this-cpu"])
@pytest.mark.parametrize("opset", [17, 21])
def test_the_rewritten_graph_computes_the_w8a8_arithmetic(settings: Int8Settings, opset: int) -> None:
    model, w = two_layer_graph(opset)
    fp32 = run(model, activations())
    converted, count = per_token_int8(model, settings)
    ops = [n.op_type for n in converted.graph.node]
    assert count == 3 == ops.count("MatMulInteger") and "MatMul" not in ops
    assert ops.count("ReduceMax") == 2  # x is quantized once for its two MatMuls, r once
    kept = {t.name for t in converted.graph.initializer}
    assert "w2" in kept and not {"w1", "w3"} & kept  # w2 is still read by the Identity; w1, w3 are gone
    x = activations()
    y, z, w2copy = run(converted, x)
    limit = 63.0 if settings.reduce_range else 127.0
    h = np.maximum(w8a8(x, w["w1"], limit), 0)
    np.testing.assert_allclose(y, w8a8(h, w["w2"], limit), rtol=1e-5, atol=1e-5 * np.abs(y).max())
    np.testing.assert_allclose(z, w8a8(x, w["w3"], limit), rtol=1e-5, atol=1e-6 * np.abs(z).max())
    np.testing.assert_array_equal(w2copy, w["w2"])
    assert np.all(np.isfinite(y)) and np.all(z[2] == 0) and np.all(z[:, 5] == 0)
    # and close to fp32: within a few per cent of each row's range (7-bit weights: twice the step)
    for got, ref in ((z, fp32[1]), (y, fp32[0])):
        for row in (0, 1, 3, 4):
            assert np.abs(got[row] - ref[row]).max() <= (0.04 if settings.reduce_range else 0.02) * \
                np.abs(ref[row]).max()


@pytest.mark.aarch64
def test_a_row_gives_the_same_result_alone_and_in_a_batch_unlike_per_tensor_dynamic_quantization(
        tmp_path: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model, _ = two_layer_graph()
    onnx.save(model, str(tmp_path / "fp32.onnx"))
    quantize_dynamic(str(tmp_path / "fp32.onnx"), str(tmp_path / "dynamic.onnx"), weight_type=QuantType.QInt8,
                     per_channel=True)
    converted, _ = per_token_int8(model, HOST)
    batch = activations()  # its row 1 is 40x larger than the others
    alone = batch[[0]]
    per_token = run(converted, batch)[1], run(converted, alone)[1]
    np.testing.assert_array_equal(per_token[0][0], per_token[1][0])
    dynamic = onnx.load(str(tmp_path / "dynamic.onnx"))
    per_tensor = run(dynamic, batch)[1], run(dynamic, alone)[1]
    assert not np.array_equal(per_tensor[0][0], per_tensor[1][0])  # the outlier row coarsened row 0


def test_a_weight_shared_by_two_matmuls_is_converted_once() -> None:
    w = np.random.default_rng(1).standard_normal((K, N)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["b"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", K])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "ab"],
                              [numpy_helper.from_array(w, "w")])
    converted, count = per_token_int8(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                                      X86_VNNI)
    names = [t.name for t in converted.graph.initializer]
    assert count == 2 and names.count("w.int8") == 1 and "w" not in names
    x = activations()
    a, b = run(converted, x)
    np.testing.assert_allclose(a, w8a8(x, w, 127.0), rtol=1e-5, atol=1e-5 * np.abs(a).max())
    np.testing.assert_allclose(b, w8a8(np.maximum(x, 0), w, 127.0), rtol=1e-5, atol=1e-5 * np.abs(b).max())


def test_a_graph_without_constant_weights_is_left_alone() -> None:
    nodes = [helper.make_node("MatMul", ["x", "y"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 4]) for n in "xy"],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    converted, count = per_token_int8(model, X86_VNNI)
    assert count == 0 and converted.SerializeToString() == before


@pytest.mark.aarch64
@pytest.mark.parametrize("settings", [X86_VNNI, ARM, X86_NO_VNNI], ids=["u8-x86-vnni", "s8-arm", "u8-7bit"])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("zero_points", [False, True], ids=["int8", "uint8-zero-points"])
def test_given_int8_weights_keep_their_integers_and_scales(settings: Int8Settings, per_column: bool,
                                                           zero_points: bool) -> None:
    """A MatMul of ``DequantizeLinear(int8 weight)`` (an export's own integers, as decoder_zoo writes
    them) takes those integers and scales as they are: the W8A8 arithmetic on them, not on integers
    rounded again from the dequantized floats; uint8 integers keep their zero points (MatMulInteger's
    own); ``only_given`` leaves a float MatMul beside it alone; int8 integers beyond 7 bits under
    ``reduce_range`` are left to ONNX Runtime's own kernel."""
    rng = np.random.default_rng(5)
    q = rng.integers(-60, 61, (K, N)).astype(np.int8)  # within 7 bits: every setting takes them
    scale = (rng.random(N if per_column else ()) * 0.01 + 0.001).astype(np.float32)
    zero = rng.integers(90, 160, N if per_column else ()).astype(np.uint8)
    if zero_points:
        q = rng.integers(0, 256, (K, N)).astype(np.uint8)
    w3 = rng.standard_normal((K, N)).astype(np.float32) * 0.1

    def model_of(integers: np.ndarray) -> onnx.ModelProto:
        zero_input = ["zp"] if zero_points else []
        nodes = [helper.make_node("DequantizeLinear", ["q", "s"] + zero_input, ["w"],
                                  **({"axis": 1} if per_column else {})),
                 helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("MatMul", ["x", "w3"], ["z"])]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", K])],
                                  [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")],
                                  [numpy_helper.from_array(integers, "q"), numpy_helper.from_array(scale, "s"),
                                   numpy_helper.from_array(w3, "w3")]
                                  + ([numpy_helper.from_array(zero, "zp")] if zero_points else []))
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    model = model_of(q)
    x = activations()
    z = run(model, x)[1]
    converted, count = per_token_int8(model, settings, only_given=True)
    ops = [n.op_type for n in converted.graph.node]
    assert count == 1 and "DequantizeLinear" not in ops and ops.count("MatMul") == 1
    matmul = next(n for n in converted.graph.node if n.op_type == "MatMulInteger")
    assert matmul.input[1] == "q"  # the given integers, not a copy rounded again
    row = np.maximum(np.abs(x).max(axis=-1, keepdims=True) / 127, 1e-30)
    integers = q.astype(np.int64) - (zero.astype(np.int64) if zero_points else 0)
    expected = (np.round(x / row).astype(np.int64) @ integers).astype(np.float32) \
        * row.astype(np.float32) * np.broadcast_to(scale, (N,))
    y_int8, z_after = run(converted, x)
    np.testing.assert_allclose(y_int8, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    np.testing.assert_array_equal(z_after, z)
    wide = q.copy()
    wide[0, 0] = 255 if zero_points else 127
    _, count = per_token_int8(model_of(wide), settings, only_given=True)
    assert count == (0 if settings.reduce_range and not zero_points else 1)  # u8 x u8 does not saturate
