"""Which ONNX nodes the OpenCL backend claims, checked per node.

Two kinds of claim:

* kernel ops: float32 tensors computed on the device; the attributes are
  checked here against what the kernels implement;
* fold-only ops (Shape, Gather, Cast, ... on integer tensors): evaluated on
  the host at compile time once input shapes are bound. They are claimed
  when their data is non-float (shape arithmetic); compile() still raises
  UnsupportedNodesError for any that turn out to depend on runtime values.

``claim(node, specs)`` returns None when claimed, else the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from backends.base import TensorSpec
from backends.opencl.attrs import node_attrs

if TYPE_CHECKING:
    import onnx

ACTIVATIONS = frozenset({
    "Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Gelu",
    "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Softplus", "Elu", "Sin", "Cos",
})
BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"})
VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})
KERNEL_OPS = ACTIVATIONS | BINARY | VIEWS | frozenset({
    "Conv", "ConvTranspose", "BatchNormalization", "MaxPool", "AveragePool",
    "GlobalAveragePool", "GlobalMaxPool", "Gemm", "MatMul", "Softmax", "LogSoftmax",
    "LayerNormalization", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "Concat",
    "Transpose", "Resize", "Pad", "Slice", "Split", "Cast",
})
# Always foldable once shapes are bound: they read shapes or attributes only.
SHAPE_ONLY = frozenset({"Shape", "Size", "Constant", "ConstantOfShape"})
# Never folded: their results differ run to run.
NONDETERMINISTIC = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
    "Multinomial",
})
FOLD_ONLY = SHAPE_ONLY | frozenset({
    "Gather", "Cast", "Range", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
    "Not", "And", "Or", "Where", "Expand", "Tile", "ReduceProd", "Floor", "Ceil", "Round",
    "NonZero", "Concat", "Unsqueeze", "Squeeze", "Reshape", "Slice", "Add", "Sub", "Mul", "Div",
    "Mod", "Max", "Min", "Abs", "Neg", "Sqrt", "Identity", "Transpose", "Flatten", "Split",
    "ReduceSum", "ReduceMax", "ReduceMin", "CastLike", "Sign", "ScatterND", "GatherElements", "CumSum",
})
# Input slots that carry parameters (axes, shapes, scales), not tensors to compute on.
PARAM_SLOTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}), "Resize": frozenset({1, 2, 3}), "Pad": frozenset({1, 2, 3}),
    "Clip": frozenset({1, 2}), "ReduceMean": frozenset({1}), "ReduceSum": frozenset({1}),
    "ReduceMax": frozenset({1}), "ReduceMin": frozenset({1}), "Squeeze": frozenset({1}),
    "Unsqueeze": frozenset({1}), "Slice": frozenset({1, 2, 3, 4}), "Split": frozenset({1}),
    "Dropout": frozenset({1, 2}), "Expand": frozenset({1}), "Tile": frozenset({1}),
    "ConstantOfShape": frozenset({0}),
}
_PAD_MODES = frozenset({"constant", "reflect", "edge", "wrap"})
_AUTO_PADS = frozenset({"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"})
_RESIZE_COORDS = frozenset({"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                            "half_pixel_symmetric"})
_NEAREST_MODES = frozenset({"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})
FLOAT = "float32"


def _dtype(specs: Mapping[str, TensorSpec], name: str) -> str | None:
    spec = specs.get(name) if name else None
    return spec.dtype if spec is not None else None


def _rank(specs: Mapping[str, TensorSpec], name: str) -> int | None:
    spec = specs.get(name) if name else None
    return len(spec.shape) if spec is not None else None


def _data_names(node: "onnx.NodeProto") -> tuple[list[str], list[str]]:
    """(data inputs, data outputs): parameter slots and typed side outputs left out."""
    params = PARAM_SLOTS.get(node.op_type, frozenset())
    inputs = [n for i, n in enumerate(node.input) if n and i not in params]
    outputs = [n for n in node.output if n]
    if node.op_type in ("Dropout", "LayerNormalization"):
        outputs = outputs[:1]  # Dropout's mask is bool; Mean/InvStdDev follow stash_type
    return inputs, outputs


def data_is_float(node: "onnx.NodeProto", specs: Mapping[str, TensorSpec]) -> bool | None:
    """True/False when the node's data tensors are known to be (not) all float32; None if unknown."""
    inputs, outputs = _data_names(node)
    known = [d for d in (_dtype(specs, n) for n in inputs + outputs) if d is not None]
    if not known:
        return None
    return all(d == FLOAT for d in known)


def inputs_are_integral(node: "onnx.NodeProto", specs: Mapping[str, TensorSpec]) -> bool:
    """Whether every data input is known and non-float (shape arithmetic)."""
    inputs, _ = _data_names(node)
    known = [_dtype(specs, n) for n in inputs]
    return bool(known) and all(d is not None and not d.startswith("float") for d in known)


def claim(node: "onnx.NodeProto", specs: Mapping[str, TensorSpec]) -> str | None:
    """None if the backend takes ``node`` given the known tensor specs, else why not."""
    if node.domain not in ("", "ai.onnx"):
        return f"domain {node.domain!r} is not ai.onnx"
    op = node.op_type
    if op in NONDETERMINISTIC:
        return "non-deterministic op"
    if op in SHAPE_ONLY:
        return None
    if op in FOLD_ONLY and inputs_are_integral(node, specs):
        return None
    if data_is_float(node, specs) is False:
        return f"{op} on non-float32 data"
    if op not in KERNEL_OPS:
        return f"no OpenCL kernel for {op}"
    check = _CHECKS.get(op)
    return check(node, node_attrs(node), specs) if check else None


def _spatial_rank(node: "onnx.NodeProto", attrs: dict[str, Any],
                  specs: Mapping[str, TensorSpec]) -> int | None:
    if "kernel_shape" in attrs:
        return len(attrs["kernel_shape"])
    rank = _rank(specs, node.input[0]) or (_rank(specs, node.input[1]) if len(node.input) > 1 else None)
    return rank - 2 if rank is not None else None


def _check_conv(node: "onnx.NodeProto", attrs: dict[str, Any], specs: Mapping[str, TensorSpec]) -> str | None:
    if attrs.get("auto_pad", "NOTSET") not in _AUTO_PADS:
        return f"auto_pad {attrs.get('auto_pad')!r}"
    spatial = _spatial_rank(node, attrs, specs)
    if spatial is not None and spatial not in (1, 2):
        return f"{spatial}-D {node.op_type} (kernels cover 1-D and 2-D)"
    return None


def _check_pool(node: "onnx.NodeProto", attrs: dict[str, Any], specs: Mapping[str, TensorSpec]) -> str | None:
    if len(node.output) > 1 and node.output[1]:
        return "MaxPool Indices output"
    return _check_conv(node, attrs, specs)


def _check_batchnorm(node: "onnx.NodeProto", attrs: dict[str, Any],
                     specs: Mapping[str, TensorSpec]) -> str | None:
    if attrs.get("training_mode", 0) or any(node.output[1:]):
        return "training-mode BatchNormalization"
    return None


def _check_resize(node: "onnx.NodeProto", attrs: dict[str, Any], specs: Mapping[str, TensorSpec]) -> str | None:
    mode = attrs.get("mode", "nearest")
    if mode not in ("nearest", "linear"):
        return f"Resize mode {mode!r}"
    if attrs.get("antialias", 0):
        return "Resize antialias"
    coord = attrs.get("coordinate_transformation_mode", "half_pixel")
    if coord not in _RESIZE_COORDS:
        return f"Resize coordinate_transformation_mode {coord!r}"
    if attrs.get("nearest_mode", "round_prefer_floor") not in _NEAREST_MODES:
        return f"Resize nearest_mode {attrs.get('nearest_mode')!r}"
    rank = _rank(specs, node.input[0])
    if rank is not None and rank > 4:
        return f"Resize of rank {rank} (kernels cover rank <= 4)"
    x_spec, y_spec = specs.get(node.input[0]), specs.get(node.output[0])
    if mode == "linear" and x_spec and y_spec and x_spec.is_static() and y_spec.is_static():
        if x_spec.shape[:-2] != y_spec.shape[:-2]:
            return "linear Resize of dimensions other than the last two"
    return None


def _check_pad(node: "onnx.NodeProto", attrs: dict[str, Any], specs: Mapping[str, TensorSpec]) -> str | None:
    mode = attrs.get("mode", "constant")
    return None if mode in _PAD_MODES else f"Pad mode {mode!r}"


def _check_gelu(node: "onnx.NodeProto", attrs: dict[str, Any], specs: Mapping[str, TensorSpec]) -> str | None:
    approx = attrs.get("approximate", "none")
    return None if approx in ("none", "tanh") else f"Gelu approximate {approx!r}"


def _check_cast(node: "onnx.NodeProto", attrs: dict[str, Any], specs: Mapping[str, TensorSpec]) -> str | None:
    import onnx

    return None if attrs.get("to") == onnx.TensorProto.FLOAT else "Cast to a non-float32 type"


def _check_binary(node: "onnx.NodeProto", attrs: dict[str, Any], specs: Mapping[str, TensorSpec]) -> str | None:
    return None if len(node.input) == 2 else f"{node.op_type} with {len(node.input)} inputs"


_CHECKS = {
    "Conv": _check_conv, "ConvTranspose": _check_conv, "MaxPool": _check_pool,
    "AveragePool": _check_pool, "BatchNormalization": _check_batchnorm, "Resize": _check_resize,
    "Pad": _check_pad, "Gelu": _check_gelu, "Cast": _check_cast, "Max": _check_binary,
    "Min": _check_binary,
}
