"""A decoder's MatMuls as int8 ``MatMulInteger`` with activations quantized per token (W8A8, dynamic).

``per_token_int8(proto, settings)`` rewrites every MatMul whose second input is a
constant 2-D weight ``W [K, N]``:

* the weight: int8, symmetric, one scale per output column (``max |W[:, n]| / 127``;
  63 with ``reduce_range``, ORT's guard against ``pmaddubsw`` saturation on x86
  without VNNI);
* the activation, at run time: one scale per row (per token, ``max |x| / 127``),
  rounded to int8, or to uint8 around a zero point of 128 where the CPU multiplies
  u8 x s8 (x86, as ``quantize.int8_settings`` says);
* ``MatMulInteger`` (int32), then the row scale times the column scale back to fp32.

The row quantization is shared by the MatMuls that read the same activation (the
packed q/k/v, gate/up).

A MatMul whose weight is already 8-bit — ``DequantizeLinear`` of a constant int8 or uint8
``[K, N]`` with a scale and zero point per tensor or per column, as ``decoder_zoo`` writes an
``Int8Weight`` read from a ``quantize_dynamic`` export — keeps those integers, scales and zero
points exactly, the zero point as ``MatMulInteger``'s own (``only_given``: only those are
rewritten).

Why by hand: ``onnxruntime.quantization.quantize_dynamic`` writes the same integer
product but quantizes each activation per tensor (``DynamicQuantizeLinear``: one
scale for the whole [batch, sequence, hidden] input). In a continuous batch a row's
rounding would then depend on whatever other rows share the step, and a prefill
chunk's outlier token would coarsen every token beside it. Per token, a row's
result is the same alone or batched, the property the engine's concurrency tests
hold every precision to. No maintained converter writes per-row activation scales
for ``MatMulInteger`` (ORT's kernel takes a scalar zero point, so the per-row scale
is applied after the integer product).

Why at all: ``MatMulNBits`` keeps one pass over the weights per row, so its cost grows
with the rows of a step, while the integer GEMM reads the weights once for all rows.
Measured on a 2-core Intel Xeon (AVX-512 VNNI, AMX), ORT 1.32, an 896 x 4,864 weight, best
of 5 x 300 runs of a one-off script (µs, 1 / 8 / 512 rows): this form 65 / 125 / 3,039; 8-bit
``MatMulNBits`` at accuracy level 4 98 / 296 / 13,800; fp32 ``MatMul`` 332 / 460 / 12,200. ``decoder_quant`` times it against
``MatMulNBits`` on the device and keeps the faster (``quantize --mode int8``).
"""

from __future__ import annotations

from typing import Any, Collection

import numpy as np

from edge_runtime.optimize.quantize import Int8Settings

PREFIX = "per_token_int8"  # names of the nodes and initializers this module adds


def per_token_int8(proto: Any, settings: Int8Settings, exclude: Collection[str] = (),
                   only_given: bool = False) -> tuple[Any, int]:
    """``proto`` (weights loaded; changed in place and returned) with every MatMul of a constant 2-D
    weight, but the nodes named in ``exclude``, as a per-token int8 ``MatMulInteger``; and how many
    were rewritten. ``only_given``: only MatMuls whose weights are given as int8 (see the module
    docstring); float ones stay."""
    from onnx import TensorProto, helper, numpy_helper

    graph = proto.graph
    weights = {t.name: t for t in graph.initializer}
    limit = 63.0 if settings.reduce_range else 127.0
    given = {node.output[0]: _given_int8(node, weights, limit) for node in graph.node
             if node.op_type == "DequantizeLinear"}
    readers: dict[str, int] = {}  # how many nodes read each name, and how many of them are MatMuls
    matmul_readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
        if node.op_type == "MatMul" and len(node.input) == 2 and node.name not in exclude:
            matmul_readers[node.input[1]] = matmul_readers.get(node.input[1], 0) + 1
    signed = settings.activation_signed
    constants = [numpy_helper.from_array(np.array(1 / 127, np.float32), f"{PREFIX}.inv127"),
                 numpy_helper.from_array(np.array(1e-30, np.float32), f"{PREFIX}.tiny")]
    if not signed:
        constants += [numpy_helper.from_array(np.array(128, np.float32), f"{PREFIX}.f128"),
                      numpy_helper.from_array(np.array(128, np.uint8), f"{PREFIX}.zero_point")]
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 17)
    if opset >= 18:  # ReduceMax's axes: an attribute up to opset 17, an input from 18
        constants.append(numpy_helper.from_array(np.array([-1], np.int64), f"{PREFIX}.axes"))
    nodes, added, replaced, converted = [], [], set(), set()
    rows: dict[str, tuple[str, str]] = {}  # activation name -> (its quantized name, its row scales)
    for node in graph.node:
        rewritable = node.op_type == "MatMul" and node.name not in exclude
        integers = given.get(node.input[1]) if rewritable else None
        weight = weights.get(node.input[1]) if rewritable and not only_given else None
        if integers is None and (weight is None or len(weight.dims) != 2):
            nodes.append(node)
            continue
        x = node.input[0]
        if x not in rows:
            p = f"{PREFIX}.a{len(rows)}"
            nodes += [helper.make_node("Abs", [x], [f"{p}.abs"], name=f"{p}.abs"),
                      helper.make_node("ReduceMax", [f"{p}.abs", f"{PREFIX}.axes"], [f"{p}.max"], keepdims=1,
                                       name=f"{p}.max") if opset >= 18 else
                      helper.make_node("ReduceMax", [f"{p}.abs"], [f"{p}.max"], axes=[-1], keepdims=1,
                                       name=f"{p}.max"),
                      helper.make_node("Mul", [f"{p}.max", f"{PREFIX}.inv127"], [f"{p}.s0"], name=f"{p}.s0"),
                      # an all-zero row: a tiny scale, so it divides to zeros, not NaN
                      helper.make_node("Max", [f"{p}.s0", f"{PREFIX}.tiny"], [f"{p}.scale"], name=f"{p}.scale"),
                      helper.make_node("Div", [x, f"{p}.scale"], [f"{p}.div"], name=f"{p}.div"),
                      helper.make_node("Round", [f"{p}.div"], [f"{p}.round"], name=f"{p}.round")]
            if signed:
                nodes.append(helper.make_node("Cast", [f"{p}.round"], [f"{p}.q"], to=TensorProto.INT8,
                                              name=f"{p}.q"))
            else:  # [-127, 127] + 128: within uint8 by construction
                nodes += [helper.make_node("Add", [f"{p}.round", f"{PREFIX}.f128"], [f"{p}.shift"],
                                           name=f"{p}.shift"),
                          helper.make_node("Cast", [f"{p}.shift"], [f"{p}.q"], to=TensorProto.UINT8, name=f"{p}.q")]
            rows[x] = (f"{p}.q", f"{p}.scale")
        quantized, row_scale = rows[x]
        out = node.output[0]
        weight_zero: list[str] = []
        if integers is not None:
            w_name, scale_name, zero_name = integers
            if zero_name:  # MatMulInteger then takes the activation's zero point too: 0 for signed ones
                weight_zero = [f"{PREFIX}.zero_point" if not signed else f"{PREFIX}.zero_point_s8", zero_name]
                if signed and not any(t.name == f"{PREFIX}.zero_point_s8" for t in constants):
                    constants.append(numpy_helper.from_array(np.array(0, np.int8), f"{PREFIX}.zero_point_s8"))
        else:
            name = weight.name
            w_name, scale_name = f"{name}.int8", f"{name}.int8_scale"
            if name not in converted:  # a weight read by two MatMuls (tied) is converted once
                converted.add(name)
                w_int8, column_scale = int8_columns(numpy_helper.to_array(weight), limit)
                added += [numpy_helper.from_array(w_int8, w_name), numpy_helper.from_array(column_scale, scale_name)]
            if readers[name] == matmul_readers[name]:
                replaced.add(name)  # read only by MatMuls that are all rewritten: the fp32 copy goes
        inputs = [quantized, w_name] + (weight_zero or ([] if signed else [f"{PREFIX}.zero_point"]))
        base = node.name or out
        nodes += [helper.make_node("MatMulInteger", inputs, [f"{out}.int32"], name=f"{base}.int8"),
                  helper.make_node("Cast", [f"{out}.int32"], [f"{out}.float"], to=TensorProto.FLOAT,
                                   name=f"{base}.float"),
                  helper.make_node("Mul", [f"{out}.float", row_scale], [f"{out}.rows"], name=f"{base}.rows"),
                  helper.make_node("Mul", [f"{out}.rows", scale_name], [out], name=f"{base}.columns")]
    if not rows:
        return proto, 0
    read = {name for node in nodes for name in node.input} | {o.name for o in graph.output}
    nodes = [n for n in nodes if n.op_type != "DequantizeLinear" or n.output[0] in read]  # the given ones' went
    kept = [t for t in graph.initializer if t.name not in replaced]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + constants + added)
    return proto, sum(1 for n in nodes if n.op_type == "MatMulInteger")


def int8_columns(weight: np.ndarray, limit: float = 127.0) -> tuple[np.ndarray, np.ndarray]:
    """(int8 [K, N], scale [N]) of a MatMul weight [K, N]: symmetric, one scale per output column
    (``max |W[:, n]| / limit``)."""
    w = np.asarray(weight, np.float32)
    scale = np.maximum(np.abs(w).max(axis=0) / limit, 1e-30).astype(np.float32)
    return np.clip(np.round(w / scale), -limit, limit).astype(np.int8), scale


def _given_int8(node: Any, weights: dict[str, Any], limit: float) -> tuple[str, str, str] | None:
    """(integers, scale, zero point or "") of a ``DequantizeLinear`` of a constant int8 or uint8 [K, N]
    weight with a scale (and zero point) per tensor or per column; an int8 one only where its integers
    stay within ``limit`` (7 bits: x86 without VNNI, where u8 x s8 products can saturate); "" for a
    zero point that is absent or all 0. Else None: the MatMul it feeds is left as it is (ONNX Runtime fuses it into its own
    8-bit kernel)."""
    from onnx import TensorProto, helper, numpy_helper

    inputs = list(node.input) + [""] * (3 - len(node.input))
    q, scale = weights.get(inputs[0]), weights.get(inputs[1])
    if q is None or scale is None or q.data_type not in (TensorProto.INT8, TensorProto.UINT8) or len(q.dims) != 2:
        return None
    axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 1)
    for part in [scale] + ([weights[inputs[2]]] if inputs[2] in weights else []):
        if list(part.dims) not in ([], [1]) and (list(part.dims) != [q.dims[1]] or axis not in (1, -1)):
            return None
    if inputs[2] and inputs[2] not in weights:
        return None
    if q.data_type == TensorProto.INT8 and limit < 127 \
            and np.abs(numpy_helper.to_array(q).astype(np.int16)).max() > limit:
        return None  # (u8 x u8, a uint8 weight's product, does not saturate)
    zero = inputs[2] if inputs[2] and numpy_helper.to_array(weights[inputs[2]]).any() else ""
    return inputs[0], inputs[1], zero
