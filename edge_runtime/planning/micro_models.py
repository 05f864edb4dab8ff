"""The tiny ONNX models calibration times (``calibration.py``), built with ``onnx.helper``.

NOTE: the chains must survive every backend's graph optimiser. The OpenCL
backend's fuser (``backends/opencl/fusion.py``) folds element-wise nodes that
read only the previous result and scalar constants into one kernel, so a chain
``Add(t, c)`` costs what one node costs. Here each node also reads the graph
input ``x`` (a full-size tensor, not a constant), which no epilogue can take:
every node stays a kernel launch of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

CHAIN_BYTES_PER_ELEMENT = 12
"""Bytes one chain node moves per element: it reads two float tensors and writes one."""


def add_chain(elements: int, depth: int) -> "onnx.ModelProto":
    """``depth`` Adds in a row on ``elements`` floats: ``t(i+1) = t(i) + x``, ``t(0) = x``."""
    from onnx import helper

    nodes, previous = [], "x"
    for i in range(depth):
        out = "y" if i == depth - 1 else f"t{i}"
        nodes.append(helper.make_node("Add", [previous, "x"], [out], name=f"add{i}"))
        previous = out
    return model(nodes, [("x", [elements])], [("y", [elements])], [])


def fan(width: int) -> "onnx.ModelProto":
    """``width`` independent one-element Adds, each with its own input and output (copy latency)."""
    from onnx import TensorProto, helper

    inits = [helper.make_tensor("c", TensorProto.FLOAT, [1], [1.0])]
    nodes = [helper.make_node("Add", [f"x{i}", "c"], [f"y{i}"], name=f"add{i}") for i in range(width)]
    return model(nodes, [(f"x{i}", [1]) for i in range(width)], [(f"y{i}", [1]) for i in range(width)], inits)


def matmul(size: int) -> "onnx.ModelProto":
    """One ``size x size`` matrix product with a constant weight."""
    from onnx import helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(1).standard_normal((size, size)).astype(np.float32), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")
    return model([node], [("x", [size, size])], [("y", [size, size])], [weight])


def conv(side: int, channels: int) -> "onnx.ModelProto":
    """One 3x3 convolution, ``channels`` -> ``channels`` on a ``side x side`` image."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(2)
    weight = numpy_helper.from_array((rng.standard_normal((channels, channels, 3, 3)) * 0.1).astype(np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])
    shape = [1, channels, side, side]
    return model([node], [("x", shape)], [("y", shape)], [weight])


def model(nodes: list, inputs: list[tuple[str, list[int]]], outputs: list[tuple[str, list[int]]],
          initializers: list) -> "onnx.ModelProto":
    """A float32 opset-13 model of ``nodes`` with the named inputs and outputs."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "calibration",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              initializers)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    return proto
