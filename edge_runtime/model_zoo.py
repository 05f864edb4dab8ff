"""Deterministic small ONNX models: the demo model, and models for tests and benchmarks.

Each builder returns an ``onnx.ModelProto`` built with ``onnx.helper`` from a
fixed seed, so the same call gives the same bytes on every machine:

* ``build_mlp``         Gemm/Relu stack, dynamic batch.
* ``build_mobilenet``   MobileNet-style CNN: depthwise + pointwise Conv, BatchNorm,
                        HardSwish/ReLU6 (Clip), residual Add, GlobalAveragePool,
                        Flatten, Gemm, Softmax; dynamic batch.
* ``build_transformer`` one pre-norm transformer block: LayerNormalization,
                        MatMul attention with Softmax, Gelu (Erf form), residuals.

``tools/make_models.py`` writes them to files. This module imports ``onnx``
at module level: import it lazily (the demo and the tests do).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# Graphs with more weights than this are not checked in memory when built: the checker serialises a
# copy (two for its parse), and protobuf stops at 2 GB; vlm_parts checks them from the saved file.
IN_MEMORY_CHECK_BYTES = 256 * 2**20


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the weights held inside ``model`` (external data not counted)."""
    return sum(len(t.raw_data) + 4 * len(t.float_data) + 8 * len(t.int64_data) for t in model.graph.initializer)


class ExternalWeights:
    """An ONNX external-data file the weights of graphs built inside ``external_weights(path)`` are
    written to as they are made, so a graph from a multi-GB checkpoint never holds its weights in
    memory (protobuf also stops at 2 GB). Tensors under ``min_bytes`` stay inline (shape inference
    reads constants such as Split sizes)."""

    def __init__(self, path: Path, min_bytes: int = 1024) -> None:
        self.path, self.min_bytes = Path(path), min_bytes
        self.file = open(self.path, "wb")  # noqa: SIM115  (closed by external_weights)
        self.offset = 0

    def tensor(self, name: str, array: np.ndarray) -> onnx.TensorProto:
        array = np.ascontiguousarray(array)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        pad = -self.offset % 64  # aligned, as onnx's own writer aligns
        self.file.write(b"\0" * pad)
        self.offset += pad
        tensor = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
                                  dims=array.shape, data_location=onnx.TensorProto.EXTERNAL)
        for key, value in (("location", self.path.name), ("offset", self.offset), ("length", array.nbytes)):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
        self.file.write(memoryview(array).cast("B"))
        self.offset += array.nbytes
        return tensor


_EXTERNAL: contextvars.ContextVar[ExternalWeights | None] = contextvars.ContextVar("external_weights", default=None)


@contextlib.contextmanager
def external_weights(path: Path) -> Iterator[ExternalWeights]:
    """Within the block, graphs built with ``_GraphBuilder`` keep their weights in ``path`` (the graph
    must then be saved next to it, as ``path.name`` names it)."""
    sink = ExternalWeights(path)
    token = _EXTERNAL.set(sink)
    try:
        yield sink
    finally:
        _EXTERNAL.reset(token)
        sink.file.close()


class _GraphBuilder:
    """Collects nodes and initializers with unique names and a fixed RNG."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def const(self, prefix: str, array: np.ndarray) -> str:
        name = self.name(prefix)
        array, sink = np.asarray(array), _EXTERNAL.get()
        if sink is not None and array.nbytes >= sink.min_bytes:
            self.initializers.append(sink.tensor(name, array))
        else:
            self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def weight(self, prefix: str, shape: tuple[int, ...], fan_in: int) -> str:
        scale = np.sqrt(2.0 / max(fan_in, 1))
        return self.const(prefix, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], n_outputs: int = 1, **attrs: object) -> str | list[str]:
        outputs = [self.name(op_type.lower()) for _ in range(n_outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=self.name(op_type), **attrs))
        return outputs[0] if n_outputs == 1 else outputs

    def model(self, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="edge-runtime-make-models")
        model.ir_version = 8  # readable by every onnxruntime release we support
        external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
        if not external and initializer_bytes(model) < IN_MEMORY_CHECK_BYTES:  # else checked once saved
            onnx.checker.check_model(model)
        return model


def build_mlp(in_features: int = 64, hidden: int = 128, classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    g = _GraphBuilder(seed)
    x = "input"
    for width_in, width_out in ((in_features, hidden), (hidden, hidden)):
        w = g.weight("w", (width_in, width_out), width_in)
        b = g.const("b", g.rng.standard_normal(width_out).astype(np.float32) * 0.1)
        x = g.op("Relu", [g.op("Gemm", [x, w, b])])
    w = g.weight("w", (hidden, classes), hidden)
    b = g.const("b", np.zeros(classes, np.float32))
    g.op("Gemm", [x, w, b])
    g.nodes[-1].output[0] = "logits"
    return g.model("mlp",
                   [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", in_features])],
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])])


def _conv_bn(g: _GraphBuilder, x: str, c_in: int, c_out: int, kernel: int, stride: int, groups: int) -> str:
    w = g.weight("conv_w", (c_out, c_in // groups, kernel, kernel), c_in // groups * kernel * kernel)
    y = g.op("Conv", [x, w], kernel_shape=[kernel, kernel], strides=[stride, stride],
             pads=[kernel // 2] * 4, group=groups)
    gamma = g.const("bn_gamma", (1.0 + 0.1 * g.rng.standard_normal(c_out)).astype(np.float32))
    beta = g.const("bn_beta", (0.1 * g.rng.standard_normal(c_out)).astype(np.float32))
    mean = g.const("bn_mean", (0.1 * g.rng.standard_normal(c_out)).astype(np.float32))
    var = g.const("bn_var", (1.0 + 0.1 * g.rng.random(c_out)).astype(np.float32))
    return g.op("BatchNormalization", [y, gamma, beta, mean, var], epsilon=1e-5)


def _relu6(g: _GraphBuilder, x: str) -> str:
    return g.op("Clip", [x, g.const("zero", np.float32(0.0)), g.const("six", np.float32(6.0))])


def build_mobilenet(image_size: int = 64, width: int = 16, classes: int = 10, seed: int = 1) -> onnx.ModelProto:
    """Inverted-residual CNN; input ``input`` [batch, 3, S, S], output ``probabilities``."""
    g = _GraphBuilder(seed)
    x = g.op("HardSwish", [_conv_bn(g, "input", 3, width, 3, 2, 1)])
    channels = width
    # (expansion, out_channels, stride): two strided stages and two residual blocks
    for expansion, c_out, stride in ((2, width, 1), (4, 2 * width, 2), (4, 2 * width, 1), (4, 4 * width, 2)):
        hidden = channels * expansion
        y = _relu6(g, _conv_bn(g, x, channels, hidden, 1, 1, 1))
        y = g.op("HardSwish", [_conv_bn(g, y, hidden, hidden, 3, stride, hidden)])
        y = _conv_bn(g, y, hidden, c_out, 1, 1, 1)
        x = g.op("Add", [x, y]) if stride == 1 and c_out == channels else y
        channels = c_out
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    w = g.weight("fc_w", (channels, classes), channels)
    b = g.const("fc_b", np.zeros(classes, np.float32))
    logits = g.op("Gemm", [x, w, b])
    g.op("Softmax", [logits], axis=-1)
    g.nodes[-1].output[0] = "probabilities"
    return g.model("mobilenet_style",
                   [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, image_size, image_size])],
                   [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", classes])])


def build_resnet(image_size: int = 112, width: int = 64, classes: int = 10, seed: int = 3) -> onnx.ModelProto:
    """Residual CNN of dense 3x3 convolutions (no depthwise); input ``input`` [batch, 3, S, S], output ``logits``.

    The int8 benchmark's second CNN: dense convolutions are where int8 GEMM kernels pay off,
    depthwise ones (``build_mobilenet``) much less.
    """
    g = _GraphBuilder(seed)
    x = g.op("Relu", [_conv_bn(g, "input", 3, width, 3, 2, 1)])
    channels = width
    for c_out, stride in ((width, 1), (2 * width, 2), (2 * width, 1), (4 * width, 2)):
        y = g.op("Relu", [_conv_bn(g, x, channels, c_out, 3, stride, 1)])
        y = _conv_bn(g, y, c_out, c_out, 3, 1, 1)
        x = g.op("Relu", [g.op("Add", [x, y]) if stride == 1 and c_out == channels else y])
        channels = c_out
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    w = g.weight("fc_w", (channels, classes), channels)
    g.op("Gemm", [x, w, g.const("fc_b", np.zeros(classes, np.float32))])
    g.nodes[-1].output[0] = "logits"
    return g.model("resnet_style",
                   [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, image_size, image_size])],
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])])


def build_transformer(seq_len: int = 16, d_model: int = 64, d_ff: int = 128, seed: int = 2) -> onnx.ModelProto:
    """Single-head pre-norm block; input ``tokens`` [batch, seq, d], output ``hidden``."""
    g = _GraphBuilder(seed)

    def layer_norm(x: str) -> str:
        scale = g.const("ln_scale", np.ones(d_model, np.float32))
        bias = g.const("ln_bias", np.zeros(d_model, np.float32))
        return g.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-5)

    def linear(x: str, d_in: int, d_out: int) -> str:
        y = g.op("MatMul", [x, g.weight("w", (d_in, d_out), d_in)])
        return g.op("Add", [y, g.const("b", (0.02 * g.rng.standard_normal(d_out)).astype(np.float32))])

    h = layer_norm("tokens")
    q, k, v = (linear(h, d_model, d_model) for _ in range(3))
    scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 2, 1])])
    scores = g.op("Mul", [scores, g.const("inv_sqrt_d", np.float32(1.0 / np.sqrt(d_model)))])
    attended = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    x = g.op("Add", ["tokens", linear(attended, d_model, d_model)])
    h = linear(layer_norm(x), d_model, d_ff)
    # Gelu in its exact Erf form, as exporters emit it below opset 20.
    erf = g.op("Erf", [g.op("Div", [h, g.const("sqrt2", np.float32(np.sqrt(2.0)))])])
    gelu = g.op("Mul", [g.op("Mul", [h, g.op("Add", [erf, g.const("one", np.float32(1.0))])]),
                        g.const("half", np.float32(0.5))])
    g.op("Add", [x, linear(gelu, d_ff, d_model)])
    g.nodes[-1].output[0] = "hidden"
    return g.model("transformer_block",
                   [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", seq_len, d_model])],
                   [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", seq_len, d_model])])


BUILDERS = {"mlp": build_mlp, "mobilenet": build_mobilenet, "transformer": build_transformer}
