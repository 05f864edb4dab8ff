"""Models for the cloud tests (and the cloud peer process, re-exported).

Models are built here with ``onnx.helper`` from fixed seeds:

* ``build_cnn``    a chain CNN (Conv/Relu/MaxPool x3, GlobalAveragePool, Gemm, Softmax);
* ``build_dag``    a residual block whose output is reshaped to the *input's* shape,
                   so cuts inside it cross two tensors, one the original input;
* ``build_heavy``  a large input, a heavy middle, a small output (the best cut
                   depends on the network);
* ``build_faulty`` same signature as ``build_cnn`` but fails at run time inside
                   ONNX Runtime (a Gather index computed out of range): the cloud
                   then answers 5xx for real;
* ``build_det``    determinants of a batch of 3x3 matrices (``Det``): ONNX Runtime
                   runs it, the OpenCL backend has no kernel for it.

The cloud peer process (``ServerProcess``) lives in ``tools/cloud_peer.py``; the
benchmark uses it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from cloud_peer import ROOT, ServerProcess, free_port  # noqa: F401 (re-exported for the tests)

OPSET = 17
CNN_INPUT = "image"
CNN_SHAPE = (1, 3, 32, 32)
TOKEN = "cloud-test-token"  # the cloud server of the tests requires it


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float = 0.2) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def build_cnn(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x, channels = CNN_INPUT, 3
    for i, out_ch in enumerate((8, 16, 32)):
        inits += [_init(rng, f"w{i}", (out_ch, channels, 3, 3)), _init(rng, f"b{i}", (out_ch,), 0.05)]
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"conv{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"], name=f"relu{i}")]
        x, channels = f"relu{i}", out_ch
        if i < 2:
            nodes.append(helper.make_node("MaxPool", [x], [f"pool{i}"], name=f"pool{i}", kernel_shape=[2, 2],
                                          strides=[2, 2]))
            x = f"pool{i}"
    inits += [_init(rng, "fc_w", (32, 10)), _init(rng, "fc_b", (10,), 0.05)]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"),
              helper.make_node("Flatten", ["gap"], ["flat"], name="flat"),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc"),
              helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info(CNN_INPUT, TensorProto.FLOAT, CNN_SHAPE)],
                              [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, (1, 10))], inits)
    return _finish(graph)


def build_dag(seed: int = 1) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = [_init(rng, "w1", (16, 16)), _init(rng, "w2", (16, 16))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "x"], ["res"], name="residual"),
             helper.make_node("MatMul", ["res", "w2"], ["z"], name="mm2"),
             helper.make_node("Tanh", ["z"], ["t"], name="tanh"),
             helper.make_node("Shape", ["x"], ["x_shape"], name="shape_of_input"),
             helper.make_node("Reshape", ["t", "x_shape"], ["y"], name="reshape")]
    graph = helper.make_graph(nodes, "dag", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 8, 16))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 8, 16))], inits)
    return _finish(graph)


def build_heavy(layers: int = 24, width: int = 256, tokens: int = 64, seed: int = 2) -> onnx.ModelProto:
    """A heavy middle between a large input and a small output: x [1, 64, 256] -> y [1, 10].

    Early cuts move 64 KiB and leave the heavy work (24 x 8 MFLOP) to the
    tail; the cut after the ReduceMean moves 1 KiB but keeps the work here: the
    best cut depends on the network, which is what re-choosing is tested with.
    """
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits.append(_init(rng, f"w{i}", (width, width), 1.0 / np.sqrt(width)))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"mm{i}"], [f"relu{i}"], name=f"relu{i}")]
        x = f"relu{i}"
    inits += [_init(rng, "head_w", (width, 10)), _init(rng, "head_b", (10,), 0.05)]
    nodes += [helper.make_node("ReduceMean", [x], ["pooled"], name="pool", axes=[1], keepdims=0),
              helper.make_node("Gemm", ["pooled", "head_w", "head_b"], ["y"], name="head")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, tokens, width))]
    graph = helper.make_graph(nodes, "heavy", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 10))], inits)
    return _finish(graph)


def build_faulty() -> onnx.ModelProto:
    """``image`` in, ``probabilities`` out, and an ONNX Runtime error on every run."""
    table = numpy_helper.from_array(np.arange(10, dtype=np.float32).reshape(1, 10), "table")
    far = numpy_helper.from_array(np.array(1000.0, dtype=np.float32), "far")
    nodes = [helper.make_node("ReduceSum", [CNN_INPUT], ["total"], name="sum", keepdims=0),
             helper.make_node("Mul", ["total", "zero"], ["nothing"], name="times_zero"),
             helper.make_node("Add", ["nothing", "far"], ["index_f"], name="plus_far"),
             helper.make_node("Cast", ["index_f"], ["index"], name="cast", to=TensorProto.INT64),
             helper.make_node("Gather", ["table", "index"], ["picked"], name="gather", axis=1),
             helper.make_node("Reshape", ["picked", "shape"], ["probabilities"], name="reshape")]
    inits = [table, far, numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero"),
             numpy_helper.from_array(np.array([1, 1], dtype=np.int64), "shape")]
    graph = helper.make_graph(nodes, "faulty", [helper.make_tensor_value_info(CNN_INPUT, TensorProto.FLOAT, CNN_SHAPE)],
                              [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, (1, 1))], inits)
    return _finish(graph)


def build_det() -> onnx.ModelProto:
    """``m`` [4, 3, 3] -> ``det`` [4]: one ``Det`` node."""
    graph = helper.make_graph([helper.make_node("Det", ["m"], ["det"], name="det")], "det",
                              [helper.make_tensor_value_info("m", TensorProto.FLOAT, (4, 3, 3))],
                              [helper.make_tensor_value_info("det", TensorProto.FLOAT, (4,))])
    return _finish(graph)


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def cnn_feeds(seed: int = 0) -> dict[str, np.ndarray]:
    return {CNN_INPUT: np.random.default_rng(seed).standard_normal(CNN_SHAPE).astype(np.float32)}


def ort_outputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The oracle: plain ONNX Runtime on the whole model."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, dict(feeds))))


def write_model(repository: Path, name: str, model: onnx.ModelProto) -> None:
    (repository / name / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(repository / name / "1" / "model.onnx"))
