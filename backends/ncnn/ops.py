"""Which ONNX nodes the ``ncnn`` backend claims: those pnnx converts to ncnn layers.

The list is deliberately conservative (CNN building blocks and the shape
plumbing exporters wrap around them); a node outside it goes to ``cpu`` in a
plan. Claiming a node is a promise checked later: every conversion passes
the correctness gate (``gate``) before it serves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    import onnx

    from backends.base import TensorSpec

NCNN_OPS = frozenset({
    # convolution, normalisation, pooling
    "Conv", "ConvTranspose", "BatchNormalization", "InstanceNormalization", "LayerNormalization",
    "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Resize", "Upsample", "Pad",
    # activations
    "Relu", "Clip", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Mish",
    "Softplus", "Erf", "Exp", "Log", "Sqrt", "Pow", "Abs", "Neg", "Reciprocal",
    # arithmetic and linear layers
    "Add", "Sub", "Mul", "Div", "Max", "Min", "MatMul", "Gemm", "Softmax", "ReduceMean", "ReduceSum",
    "ReduceMax",
    # shape plumbing pnnx folds or maps (static once the input shape is fixed)
    "Reshape", "Flatten", "Transpose", "Concat", "Split", "Slice", "Squeeze", "Unsqueeze", "Identity",
    "Dropout", "Constant", "Shape", "Cast", "Gather",
})
"""ONNX op types (default domain) the backend takes."""


def supports_node(node: "onnx.NodeProto", shapes: Mapping[str, "TensorSpec"]) -> bool:
    """True for a default-domain op in ``NCNN_OPS`` whose float tensors are float32."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in NCNN_OPS:
        return False
    # ncnn computes in float32 (fp16 storage is an opt-in precision); integer tensors occur only in
    # the shape plumbing pnnx folds away, so they are fine; float64 is not.
    return not any(shapes.get(name) is not None and shapes[name].dtype == "float64"
                   for name in (*node.input, *node.output) if name)
