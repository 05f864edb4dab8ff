"""The op cases of the shared conformance suite (``test_backend_ops.py``): tiny graphs, fixed seeds.

Sizes are deliberately odd (not multiples of the kernels' tiles), with
broadcasting, groups, depthwise, strides, pads and dilations. Each case
returns ``(model, feeds)``; ``case_inputs(name)`` seeds it by its name.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from onnx import TensorProto, helper

from tests.backends.model_helpers import make_model, rand, tensor

Case = Callable[[np.random.Generator], tuple]
CASES: dict[str, Case] = {}


def case(name: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        CASES[name] = fn
        return fn
    return register


def unary(op: str, shape=(2, 3, 5, 7), low=-3.0, high=3.0, opset=17, **attrs) -> Case:
    def build(rng):
        node = helper.make_node(op, ["x"], ["y"], **attrs)
        model = make_model([node], [tensor("x", list(shape))], [tensor("y", None)], opset=opset)
        return model, {"x": rand(rng, *shape, low=low, high=high)}
    return build


for _op in ("Relu", "Sigmoid", "HardSwish", "Tanh", "Erf", "Neg", "Abs", "Exp", "Softplus"):
    CASES[_op.lower()] = unary(_op)
CASES["leakyrelu"] = unary("LeakyRelu", alpha=0.2)
CASES["hardsigmoid"] = unary("HardSigmoid", alpha=0.3, beta=0.4)
CASES["elu"] = unary("Elu", alpha=0.7)
CASES["log"] = unary("Log", low=0.1, high=5.0)
CASES["sqrt"] = unary("Sqrt", low=0.0, high=5.0)
CASES["reciprocal"] = unary("Reciprocal", low=0.5, high=3.0)
CASES["gelu_erf"] = unary("Gelu", opset=20)
CASES["gelu_tanh"] = unary("Gelu", opset=20, approximate="tanh")
CASES["clip_opset6_attrs"] = unary("Clip", opset=6, min=-0.5, max=0.7)
CASES["sin_wide_range"] = unary("Sin", low=-20.0, high=20.0)  # rotary angles reach far past pi
CASES["cos_wide_range"] = unary("Cos", low=-20.0, high=20.0)


@case("clip_relu6_inputs")
def _clip(rng):
    node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"])
    model = make_model([node], [tensor("x", [3, 17])], [tensor("y", None)],
                       {"lo": np.float32(0.0), "hi": np.float32(6.0)})
    return model, {"x": rand(rng, 3, 17, low=-4, high=10)}


@case("clip_max_only")
def _clip_max(rng):
    node = helper.make_node("Clip", ["x", "", "hi"], ["y"])
    model = make_model([node], [tensor("x", [5, 3])], [tensor("y", None)], {"hi": np.float32(0.25)})
    return model, {"x": rand(rng, 5, 3)}


def binary(op: str, a_shape, b_shape, b_low=-1.0, b_high=1.0, a_low=-1.0) -> Case:
    def build(rng):
        node = helper.make_node(op, ["a", "b"], ["y"])
        model = make_model([node], [tensor("a", list(a_shape)), tensor("b", list(b_shape))], [tensor("y", None)])
        return model, {"a": rand(rng, *a_shape, low=a_low), "b": rand(rng, *b_shape, low=b_low, high=b_high)}
    return build


CASES["add_bcast_last"] = binary("Add", (2, 3, 5, 7), (7,))
CASES["sub_bcast_both"] = binary("Sub", (2, 1, 5, 1), (1, 3, 1, 7))
CASES["mul_scalar"] = binary("Mul", (3, 11), ())
CASES["div_column"] = binary("Div", (3, 1), (1, 4), b_low=0.5, b_high=2.0)
CASES["pow_float_exp"] = binary("Pow", (4, 5), (5,), a_low=0.1, b_low=-2.0, b_high=2.0)
CASES["max_bcast"] = binary("Max", (2, 3, 4), (3, 1))
CASES["min_same"] = binary("Min", (6, 7), (6, 7))


@case("pow_negative_base_integer_exp")
def _pow_int(rng):
    node = helper.make_node("Pow", ["a", "e"], ["y"])
    model = make_model([node], [tensor("a", [4, 6])], [tensor("y", None)],
                       {"e": np.array([1, 2, 3, 0, -1, 2], np.float32)})
    return model, {"a": rand(rng, 4, 6, low=-2.0, high=2.0)}


def conv(x_shape, w_shape, bias=True, opset=17, activation=None, **attrs) -> Case:
    def build(rng):
        inputs = ["x", "w"] + (["b"] if bias else [])
        inits = {"w": rand(rng, *w_shape)}
        if bias:
            inits["b"] = rand(rng, w_shape[0])
        out = "c" if activation else "y"
        nodes = [helper.make_node("Conv", inputs, [out], **attrs)]
        if activation:
            nodes.append(helper.make_node(activation, ["c"], ["y"]))
        model = make_model(nodes, [tensor("x", list(x_shape))], [tensor("y", None)], inits, opset=opset)
        return model, {"x": rand(rng, *x_shape)}
    return build


CASES["conv3x3_pad1"] = conv((1, 5, 13, 11), (7, 5, 3, 3), pads=[1, 1, 1, 1])
CASES["conv3x3_stride2_asym_pads"] = conv((2, 3, 15, 12), (9, 3, 3, 3), strides=[2, 2], pads=[0, 1, 2, 1])
CASES["conv_dilation2"] = conv((1, 4, 14, 13), (6, 4, 3, 3), dilations=[2, 2], pads=[2, 2, 2, 2])
CASES["conv_groups2"] = conv((1, 6, 9, 10), (10, 3, 3, 3), group=2, pads=[1, 1, 1, 1])
CASES["conv_depthwise_stride2"] = conv((2, 8, 13, 13), (8, 1, 3, 3), group=8, strides=[2, 2], pads=[1, 1, 1, 1])
CASES["conv_depthwise_multiplier2"] = conv((1, 4, 9, 11), (8, 1, 3, 3), group=4, pads=[1, 1, 1, 1])
CASES["conv_same_upper"] = conv((1, 3, 10, 9), (5, 3, 4, 4), auto_pad="SAME_UPPER", strides=[2, 2])
CASES["conv_same_lower"] = conv((1, 3, 10, 9), (5, 3, 4, 3), auto_pad="SAME_LOWER", strides=[3, 2])
CASES["conv_valid_5x5"] = conv((1, 2, 12, 15), (4, 2, 5, 5), auto_pad="VALID", bias=False)
CASES["conv1x1_gemm_path"] = conv((2, 13, 7, 5), (9, 13, 1, 1))
CASES["conv1x1_stride2"] = conv((1, 6, 9, 9), (5, 6, 1, 1), strides=[2, 2])
CASES["conv1d"] = conv((2, 3, 23), (5, 3, 3), pads=[1, 1], strides=[2])
CASES["conv_relu_fused"] = conv((1, 4, 8, 9), (12, 4, 3, 3), pads=[1, 1, 1, 1], activation="Relu")
CASES["conv1x1_hardswish_fused"] = conv((1, 16, 6, 7), (24, 16, 1, 1), activation="HardSwish")


def conv_transpose(x_shape, w_shape, **attrs) -> Case:
    def build(rng):
        node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
        groups = attrs.get("group", 1)
        inits = {"w": rand(rng, *w_shape), "b": rand(rng, w_shape[1] * groups)}
        model = make_model([node], [tensor("x", list(x_shape))], [tensor("y", None)], inits)
        return model, {"x": rand(rng, *x_shape)}
    return build


CASES["convtranspose_stride2"] = conv_transpose((1, 4, 5, 6), (4, 3, 3, 3), strides=[2, 2])
CASES["convtranspose_pads_outpad"] = conv_transpose((2, 3, 4, 5), (3, 2, 3, 3), strides=[2, 2],
                                                   pads=[1, 1, 1, 1], output_padding=[1, 1])
CASES["convtranspose_groups_dilation"] = conv_transpose((1, 4, 5, 5), (4, 3, 2, 3), group=2, dilations=[2, 1])
CASES["convtranspose_1d"] = conv_transpose((1, 3, 7), (3, 2, 4), strides=[3])


@case("batchnorm_standalone")
def _bn(rng):
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)
    inits = {"s": rand(rng, 5), "b": rand(rng, 5), "m": rand(rng, 5), "v": rand(rng, 5, low=0.5, high=2)}
    model = make_model([node], [tensor("x", [2, 5, 4, 3])], [tensor("y", None)], inits)
    return model, {"x": rand(rng, 2, 5, 4, 3)}


def pool(op, x_shape, **attrs) -> Case:
    def build(rng):
        node = helper.make_node(op, ["x"], ["y"], **attrs)
        model = make_model([node], [tensor("x", list(x_shape))], [tensor("y", None)], opset=19)
        return model, {"x": rand(rng, *x_shape)}
    return build


CASES["maxpool3x3_s2_p1"] = pool("MaxPool", (2, 3, 13, 12), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
CASES["maxpool_ceil_dilation"] = pool("MaxPool", (1, 2, 11, 10), kernel_shape=[2, 3], strides=[2, 2],
                                      dilations=[2, 1], ceil_mode=1)
CASES["avgpool_exclude_pad"] = pool("AveragePool", (1, 3, 9, 8), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
CASES["avgpool_include_pad_ceil"] = pool("AveragePool", (1, 2, 10, 9), kernel_shape=[3, 2], strides=[2, 2],
                                         pads=[1, 0, 1, 1], count_include_pad=1, ceil_mode=1)
CASES["avgpool_same_upper"] = pool("AveragePool", (1, 2, 7, 8), kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")
CASES["maxpool1d"] = pool("MaxPool", (2, 3, 17), kernel_shape=[4], strides=[3], pads=[1, 2])
CASES["globalaveragepool"] = pool("GlobalAveragePool", (2, 5, 7, 9))
CASES["globalmaxpool"] = pool("GlobalMaxPool", (2, 5, 7, 9))


def gemm(a_shape, b_shape, c_shape=None, b_const=True, **attrs) -> Case:
    def build(rng):
        inputs = ["a", "b"] + (["c"] if c_shape is not None else [])
        node = helper.make_node("Gemm", inputs, ["y"], **attrs)
        inits = {"c": rand(rng, *c_shape)} if c_shape is not None else {}
        graph_inputs = [tensor("a", list(a_shape))]
        feeds = {"a": rand(rng, *a_shape)}
        if b_const:
            inits["b"] = rand(rng, *b_shape)
        else:
            graph_inputs.append(tensor("b", list(b_shape)))
            feeds["b"] = rand(rng, *b_shape)
        return make_model([node], graph_inputs, [tensor("y", None)], inits), feeds
    return build


CASES["gemm_odd_bias_row"] = gemm((37, 45), (45, 29), (29,))
CASES["gemm_transA_transB_alpha_beta"] = gemm((45, 37), (29, 45), (37, 1), transA=1, transB=1, alpha=0.5, beta=2.0)
CASES["gemm_scalar_c"] = gemm((3, 7), (7, 5), (), beta=0.3)
CASES["gemm_full_c_runtime_b"] = gemm((6, 9), (9, 10), (6, 10), b_const=False)
CASES["gemm_runtime_b_transB"] = gemm((17, 33), (12, 33), None, b_const=False, transB=1)


def matmul(a_shape, b_shape, b_const=False, bias=None) -> Case:
    def build(rng):
        nodes = [helper.make_node("MatMul", ["a", "b"], ["m" if bias else "y"])]
        inits, feeds = {}, {"a": rand(rng, *a_shape)}
        graph_inputs = [tensor("a", list(a_shape))]
        if b_const:
            inits["b"] = rand(rng, *b_shape)
        else:
            graph_inputs.append(tensor("b", list(b_shape)))
            feeds["b"] = rand(rng, *b_shape)
        if bias is not None:
            inits["bias"] = rand(rng, *bias)
            nodes.append(helper.make_node("Add", ["m", "bias"], ["y"]))
        return make_model(nodes, graph_inputs, [tensor("y", None)], inits), feeds
    return build


CASES["matmul_2d_odd"] = matmul((19, 23), (23, 13))
CASES["matmul_3d_x_weights"] = matmul((2, 9, 17), (17, 11), b_const=True)
CASES["matmul_4d_broadcast"] = matmul((2, 1, 5, 6), (1, 3, 6, 4))
CASES["matmul_1d_2d"] = matmul((7,), (7, 5))
CASES["matmul_2d_1d"] = matmul((6, 7), (7,), b_const=True)
CASES["matmul_bias_fused"] = matmul((3, 5, 16), (16, 12), b_const=True, bias=(12,))
CASES["matmul_bias_not_fusable"] = matmul((3, 5, 16), (16, 12), b_const=True, bias=(5, 1))


def softmax(op, shape, opset=17, **attrs) -> Case:
    def build(rng):
        node = helper.make_node(op, ["x"], ["y"], **attrs)
        model = make_model([node], [tensor("x", list(shape))], [tensor("y", None)], opset=opset)
        return model, {"x": rand(rng, *shape, low=-5, high=5)}
    return build


CASES["softmax_last"] = softmax("Softmax", (3, 4, 33))
CASES["softmax_axis1_3d"] = softmax("Softmax", (2, 7, 5), axis=1)
CASES["softmax_opset11_coerced"] = softmax("Softmax", (2, 3, 4), opset=11, axis=1)
CASES["logsoftmax"] = softmax("LogSoftmax", (5, 9), axis=-1)
# rows long enough for a work-group per row (OpenCL softmax_rows), not a multiple of it
CASES["softmax_long_rows"] = softmax("Softmax", (2, 3, 7, 203))
CASES["logsoftmax_long_rows"] = softmax("LogSoftmax", (6, 130), axis=1)


def layernorm(shape, axis=-1, bias=True, stats=False) -> Case:
    def build(rng):
        norm_shape = shape[axis:]
        inputs = ["x", "s"] + (["b"] if bias else [])
        outputs = ["y", "mean", "inv"] if stats else ["y"]
        node = helper.make_node("LayerNormalization", inputs, outputs, axis=axis, epsilon=1e-4)
        inits = {"s": rand(rng, *norm_shape)}
        if bias:
            inits["b"] = rand(rng, *norm_shape)
        model = make_model([node], [tensor("x", list(shape))], [tensor(o, None) for o in outputs], inits)
        return model, {"x": rand(rng, *shape, low=-2, high=3)}
    return build


CASES["layernorm_last"] = layernorm((2, 5, 19))
CASES["layernorm_axis_m2_nobias"] = layernorm((3, 4, 6), axis=-2, bias=False)
CASES["layernorm_stats_outputs"] = layernorm((4, 10), stats=True)


def reduce(op, shape, axes, keepdims=1, opset=17) -> Case:
    def build(rng):
        if opset >= 18 or op != "ReduceMean" and opset >= 13 and op == "ReduceSum":
            node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
            inits = {"axes": np.array(axes, np.int64)}
        else:
            node = helper.make_node(op, ["x"], ["y"], axes=axes, keepdims=keepdims)
            inits = {}
        model = make_model([node], [tensor("x", list(shape))], [tensor("y", None)], inits, opset=opset)
        return model, {"x": rand(rng, *shape)}
    return build


CASES["reducemean_axis1_keep"] = reduce("ReduceMean", (2, 5, 7), [1])
CASES["reducemean_axes02_drop"] = reduce("ReduceMean", (3, 4, 5), [0, 2], keepdims=0)
CASES["reducemean_opset18_input"] = reduce("ReduceMean", (2, 3, 4, 5), [-1, -2], opset=18)
CASES["reducesum_opset13"] = reduce("ReduceSum", (4, 6), [0], opset=13)
CASES["reducemax"] = reduce("ReduceMax", (3, 5, 2), [1], keepdims=0)


@case("concat_three_axis1")
def _concat(rng):
    node = helper.make_node("Concat", ["a", "b", "c"], ["y"], axis=1)
    shapes = {"a": (2, 3, 5), "b": (2, 1, 5), "c": (2, 4, 5)}
    model = make_model([node], [tensor(k, list(v)) for k, v in shapes.items()], [tensor("y", None)])
    return model, {k: rand(rng, *v) for k, v in shapes.items()}


@case("concat_last_axis_with_constant")
def _concat_last(rng):
    node = helper.make_node("Concat", ["a", "k"], ["y"], axis=-1)
    model = make_model([node], [tensor("a", [3, 7])], [tensor("y", None)], {"k": rand(rng, 3, 2)})
    return model, {"a": rand(rng, 3, 7)}


@case("views_reshape_flatten_squeeze_unsqueeze")
def _views(rng):
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["a"]),
             helper.make_node("Unsqueeze", ["a", "ax0"], ["b"]),
             helper.make_node("Squeeze", ["b", "ax0"], ["c"]),
             helper.make_node("Flatten", ["c"], ["d"], axis=2),
             helper.make_node("Sigmoid", ["d"], ["y"])]
    inits = {"shape": np.array([0, -1, 5], np.int64), "ax0": np.array([0], np.int64)}
    model = make_model(nodes, [tensor("x", [2, 3, 10])], [tensor("y", None)], inits)
    return model, {"x": rand(rng, 2, 3, 10)}


@case("transpose_nhwc")
def _transpose(rng):
    node = helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1])
    return make_model([node], [tensor("x", [2, 3, 5, 7])], [tensor("y", None)]), {"x": rand(rng, 2, 3, 5, 7)}


@case("transpose_3d_default_perm")
def _transpose_default(rng):
    node = helper.make_node("Transpose", ["x"], ["y"])
    return make_model([node], [tensor("x", [4, 3, 6])], [tensor("y", None)]), {"x": rand(rng, 4, 3, 6)}


def resize(x_shape, scales=None, sizes=None, opset=19, **attrs) -> Case:
    def build(rng):
        inputs = ["x", "", "scales" if scales is not None else ""]
        inits = {}
        if scales is not None:
            inits["scales"] = np.array(scales, np.float32)
        if sizes is not None:
            inputs.append("sizes")
            inits["sizes"] = np.array(sizes, np.int64)
        node = helper.make_node("Resize", inputs, ["y"], **attrs)
        model = make_model([node], [tensor("x", list(x_shape))], [tensor("y", None)], inits, opset=opset)
        return model, {"x": rand(rng, *x_shape)}
    return build


CASES["resize_nearest_2x_asymmetric_floor"] = resize((1, 3, 5, 7), scales=[1, 1, 2, 2], mode="nearest",
                                                     coordinate_transformation_mode="asymmetric", nearest_mode="floor")
CASES["resize_nearest_sizes_half_pixel"] = resize((2, 2, 6, 5), sizes=[2, 2, 9, 11], mode="nearest",
                                                  nearest_mode="round_prefer_ceil")
CASES["resize_linear_down_half_pixel"] = resize((1, 2, 9, 13), scales=[1, 1, 0.6, 0.5], mode="linear")
CASES["resize_linear_align_corners_up"] = resize((1, 3, 4, 5), sizes=[1, 3, 7, 9], mode="linear",
                                                 coordinate_transformation_mode="align_corners")
CASES["resize_linear_pytorch_half_pixel"] = resize((2, 1, 5, 6), scales=[1, 1, 1.5, 2.5], mode="linear",
                                                   coordinate_transformation_mode="pytorch_half_pixel")


def pad(x_shape, pads, mode="constant", value=None, opset=18) -> Case:
    def build(rng):
        inputs = ["x", "pads"] + (["value"] if value is not None else [])
        inits = {"pads": np.array(pads, np.int64)}
        if value is not None:
            inits["value"] = np.float32(value)
        node = helper.make_node("Pad", inputs, ["y"], mode=mode)
        model = make_model([node], [tensor("x", list(x_shape))], [tensor("y", None)], inits, opset=opset)
        return model, {"x": rand(rng, *x_shape)}
    return build


CASES["pad_constant_value"] = pad((1, 2, 4, 5), [0, 0, 1, 2, 0, 1, 2, 1], value=1.5)
CASES["pad_reflect"] = pad((1, 2, 4, 5), [0, 0, 2, 3, 0, 0, 1, 2], mode="reflect")
CASES["pad_edge"] = pad((2, 3, 5), [0, 2, 1, 0, 1, 3], mode="edge")
CASES["pad_negative_crop"] = pad((2, 6, 7), [0, -1, 2, 0, -2, -1])
CASES["pad_wrap"] = pad((1, 3, 4), [0, 1, 2, 0, 2, 3], mode="wrap", opset=19)


@case("slice_steps_negative")
def _slice(rng):
    node = helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])
    inits = {"st": np.array([1, -1], np.int64), "en": np.array([6, -100], np.int64),
             "ax": np.array([1, 2], np.int64), "sp": np.array([2, -2], np.int64)}
    model = make_model([node], [tensor("x", [2, 7, 9])], [tensor("y", None)], inits)
    return model, {"x": rand(rng, 2, 7, 9)}


@case("split_sizes_input")
def _split(rng):
    node = helper.make_node("Split", ["x", "s"], ["y0", "y1", "y2"], axis=1)
    model = make_model([node], [tensor("x", [3, 10])], [tensor(f"y{i}", None) for i in range(3)],
                       {"s": np.array([2, 5, 3], np.int64)})
    return model, {"x": rand(rng, 3, 10)}


@case("split_num_outputs_opset18")
def _split18(rng):
    node = helper.make_node("Split", ["x"], ["y0", "y1", "y2"], axis=-1, num_outputs=3)
    model = make_model([node], [tensor("x", [2, 3, 8])], [tensor(f"y{i}", None) for i in range(3)], opset=18)
    return model, {"x": rand(rng, 2, 3, 8)}


@case("dropout_identity_with_mask")
def _dropout(rng):
    nodes = [helper.make_node("Dropout", ["x", "ratio"], ["d", "mask"]),
             helper.make_node("Identity", ["d"], ["y"])]
    model = make_model(nodes, [tensor("x", [4, 5])],
                       [tensor("y", None), tensor("mask", None, TensorProto.BOOL)], {"ratio": np.float32(0.3)})
    return model, {"x": rand(rng, 4, 5)}


@case("shape_gather_concat_reshape_chain")
def _shape_chain(rng):
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"]),
             helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", TensorProto.FLOAT, [], [0.5])),
             helper.make_node("Mul", ["r", "k"], ["y"])]
    inits = {"zero": np.array(0, np.int64), "ax0": np.array([0], np.int64), "minus1": np.array([-1], np.int64)}
    model = make_model(nodes, [tensor("x", [3, 4, 5])], [tensor("y", None)], inits)
    return model, {"x": rand(rng, 3, 4, 5)}


@case("residual_add_relu_fused")
def _residual(rng):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 4, 6, 5])], [tensor("y", None)], {"w": rand(rng, 4, 4, 3, 3)})
    return model, {"x": rand(rng, 1, 4, 6, 5)}


# Ops ORT 1.32 does not run at the opset the case needs: compare with the ONNX reference.
REFERENCE_ORACLE = {"pad_wrap"}


def case_inputs(name: str) -> tuple:
    return CASES[name](np.random.default_rng(sorted(CASES).index(name) + 11))
