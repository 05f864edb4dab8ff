"""Small models for the optimisation tests, built with ``onnx.helper`` from fixed seeds.

* ``small_cnn``: float Conv/Relu stack with a classifier head (what users quantize).
* ``conv_integer_model``: arrives quantized the way ``quantize_dynamic`` writes it —
  ``DynamicQuantizeLinear`` -> ``ConvInteger`` -> ``Cast`` -> scale ``Mul`` — written
  by hand here, followed by a float tail an accelerator can take.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _model(nodes: list, inits: list, inputs: list, outputs: list, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _float_tail(rng: np.random.Generator, x: str, channels: int, classes: int, nodes: list, inits: list) -> None:
    """Two 3x3 Conv+Relu, GlobalAveragePool, Flatten, Gemm -> ``logits``."""
    for i in range(2):
        w = f"tail_w{i}"
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((channels, channels, 3, 3)) * np.sqrt(2 / (9 * channels))).astype(np.float32), w))
        inits.append(numpy_helper.from_array((0.05 * rng.standard_normal(channels)).astype(np.float32), f"tail_b{i}"))
        nodes.append(helper.make_node("Conv", [x, w, f"tail_b{i}"], [f"tail_c{i}"], name=f"tail_conv{i}",
                                      kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"tail_c{i}"], [f"tail_r{i}"], name=f"tail_relu{i}"))
        x = f"tail_r{i}"
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten", axis=1))
    inits.append(numpy_helper.from_array(rng.standard_normal((channels, classes)).astype(np.float32), "fc_w"))
    inits.append(numpy_helper.from_array(np.zeros(classes, np.float32), "fc_b"))
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc"))


def small_cnn(size: int = 16, channels: int = 8, classes: int = 5, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes: list = []
    inits = [numpy_helper.from_array((rng.standard_normal((channels, 3, 3, 3)) * 0.3).astype(np.float32), "stem_w"),
             numpy_helper.from_array((0.05 * rng.standard_normal(channels)).astype(np.float32), "stem_b")]
    nodes.append(helper.make_node("Conv", ["input", "stem_w", "stem_b"], ["stem"], name="stem",
                                  kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Relu", ["stem"], ["stem_r"], name="stem_relu"))
    _float_tail(rng, "stem_r", channels, classes, nodes, inits)
    return _model(nodes, inits, [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])], "small_cnn")


def conv_integer_model(size: int = 16, channels: int = 8, classes: int = 5, seed: int = 3) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w_scale = np.float32(0.02)
    w_int8 = rng.integers(-60, 60, size=(channels, 3, 3, 3), dtype=np.int8)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["input"], ["x_q", "x_scale", "x_zp"], name="dql"),
        helper.make_node("ConvInteger", ["x_q", "w_q", "x_zp"], ["acc"], name="conv_integer",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Cast", ["acc"], ["acc_f"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x_scale", "w_scale"], ["scale"], name="scale"),
        helper.make_node("Mul", ["acc_f", "scale"], ["stem"], name="rescale"),
        helper.make_node("Relu", ["stem"], ["stem_r"], name="stem_relu"),
    ]
    inits = [numpy_helper.from_array(w_int8, "w_q"), numpy_helper.from_array(w_scale, "w_scale")]
    _float_tail(rng, "stem_r", channels, classes, nodes, inits)
    return _model(nodes, inits, [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])], "conv_integer")
