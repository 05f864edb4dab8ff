"""Build small ``.tflite`` models without TensorFlow: a hand-written flatbuffer writer.

The writer follows the TFLite schema (``tensorflow/lite/schema/schema.fbs``,
version 3); table slots are the schema's field order. It knows just enough to
write the test models of ``backends/tflite``:

* :func:`float_cnn` — CONV_2D, RELU6, DEPTHWISE_CONV_2D, HARD_SWISH, ADD,
  AVERAGE_POOL_2D, RESHAPE, FULLY_CONNECTED, ADD, SOFTMAX (two ADDs apart, so a
  delegate that claims ADD gets two partitions);
* :func:`quantized_cnn` — the same network in int8 (per-channel conv weights),
  with int8 or uint8 graph inputs/outputs; activation ranges are calibrated by
  running the float model through LiteRT with every intermediate kept;
* :func:`two_signature_model` — two subgraphs exposed as signatures
  ``combine`` (a, b -> sum, product) and ``affine`` (x -> y = 3x + 1);
* :func:`dynamic_batch_model` — an ADD whose batch dimension is left open.

Usage: ``python tools/make_tflite_models.py OUT_DIR`` writes all of them.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import flatbuffers
import numpy as np

# BuiltinOperator codes.
ADD, AVERAGE_POOL_2D, CONV_2D, DEPTHWISE_CONV_2D = 0, 1, 3, 4
FULLY_CONNECTED, MUL, RELU6, RESHAPE, SOFTMAX = 9, 18, 21, 22, 25
QUANTIZE, HARD_SWISH = 114, 117
_TENSOR_TYPES = {"float32": 0, "int32": 2, "uint8": 3, "int64": 4, "int8": 9}
_SAME, _VALID = 0, 1
_ACT_NONE = 0

Options = tuple[int, tuple[tuple[int, str, object], ...]]
"""A BuiltinOptions union member: (union type, ((slot, kind, value), ...))."""


@dataclass(frozen=True)
class Quant:
    """Affine quantization: ``real = scale * (q - zero_point)``, per tensor or along ``axis``."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int = 0


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    buffer: int
    quant: Quant | None
    signature: tuple[int, ...] | None = None  # shape with -1 where the size is left open


@dataclass
class Subgraph:
    """Tensors and operators of one subgraph; build it through the methods."""

    model: "ModelBuilder"
    name: str
    tensors: list[_Tensor] = field(default_factory=list)
    operators: list[tuple[int, list[int], list[int], Options | None]] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def tensor(self, name: str, shape: tuple[int, ...], dtype: str = "float32",
               quant: Quant | None = None) -> int:
        self.tensors.append(_Tensor(name, tuple(shape), dtype, 0, quant))
        return len(self.tensors) - 1

    def input(self, name: str, shape: tuple[int, ...], dtype: str = "float32",
              quant: Quant | None = None, signature: tuple[int, ...] | None = None) -> int:
        index = self.tensor(name, shape, dtype, quant)
        self.tensors[index].signature = signature
        self.inputs.append(index)
        return index

    def const(self, name: str, value: np.ndarray, quant: Quant | None = None) -> int:
        value = np.ascontiguousarray(value)
        buffer = self.model.add_buffer(value.tobytes())
        self.tensors.append(_Tensor(name, value.shape, value.dtype.name, buffer, quant))
        return len(self.tensors) - 1

    def op(self, code: int, inputs: list[int], outputs: list[int], options: Options | None = None) -> None:
        self.operators.append((self.model.opcode(code), inputs, outputs, options))


class ModelBuilder:
    """Collects buffers, operator codes, subgraphs and signatures; ``to_bytes`` writes the file."""

    def __init__(self, description: str = "edge-runtime test model") -> None:
        self.description = description
        self.buffers: list[bytes] = [b""]  # buffer 0 is the schema's empty sentinel
        self.opcodes: list[int] = []
        self.subgraphs: list[Subgraph] = []
        self.signatures: list[tuple[str, int, dict[str, int], dict[str, int]]] = []

    def add_buffer(self, data: bytes) -> int:
        self.buffers.append(data)
        return len(self.buffers) - 1

    def opcode(self, code: int) -> int:
        if code not in self.opcodes:
            self.opcodes.append(code)
        return self.opcodes.index(code)

    def subgraph(self, name: str) -> Subgraph:
        self.subgraphs.append(Subgraph(self, name))
        return self.subgraphs[-1]

    def signature(self, key: str, subgraph: Subgraph, inputs: dict[str, int], outputs: dict[str, int]) -> None:
        self.signatures.append((key, self.subgraphs.index(subgraph), inputs, outputs))

    def to_bytes(self) -> bytes:
        b = flatbuffers.Builder(1024)
        b.ForceDefaults(True)
        buffers = [_buffer(b, data) for data in self.buffers]
        opcodes = [_table(b, 4, [(0, "i8", min(code, 127)), (2, "i32", 1), (3, "i32", code)])
                   for code in self.opcodes]
        subgraphs = [_subgraph(b, sg) for sg in self.subgraphs]
        signatures = [_signature(b, *sig) for sig in self.signatures]
        description = b.CreateString(self.description)
        fields: list[tuple[int, str, object]] = [
            (0, "u32", 3), (1, "off", _offsets(b, opcodes)), (2, "off", _offsets(b, subgraphs)),
            (3, "off", description), (4, "off", _offsets(b, buffers))]
        if signatures:
            fields.append((7, "off", _offsets(b, signatures)))
        b.Finish(_table(b, 10, fields), file_identifier=b"TFL3")
        return bytes(b.Output())


def _table(b: flatbuffers.Builder, slots: int, fields: list[tuple[int, str, object]]) -> int:
    """One table; children (strings, vectors, tables) must already be written."""
    b.StartObject(slots)
    prepend = {"i8": b.PrependInt8Slot, "u8": b.PrependUint8Slot, "i32": b.PrependInt32Slot,
               "u32": b.PrependUint32Slot, "f32": b.PrependFloat32Slot, "bool": b.PrependBoolSlot,
               "off": b.PrependUOffsetTRelativeSlot}
    for slot, kind, value in fields:
        prepend[kind](slot, value, 0)  # the builder forces defaults: every listed field is written
    return b.EndObject()


def _offsets(b: flatbuffers.Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        b.PrependUOffsetTRelative(offset)
    return b.EndVector()


def _buffer(b: flatbuffers.Builder, data: bytes) -> int:
    if not data:
        return _table(b, 3, [])
    # Weights are read in place (mmap); 16-byte alignment keeps SIMD kernels happy.
    b.StartVector(1, len(data), 16)
    b.head -= len(data)
    b.Bytes[b.head:b.head + len(data)] = data
    return _table(b, 3, [(0, "off", b.EndVector())])


def _subgraph(b: flatbuffers.Builder, sg: Subgraph) -> int:
    tensors = []
    for t in sg.tensors:
        shape = b.CreateNumpyVector(np.array(t.shape, dtype=np.int32))
        name = b.CreateString(t.name)
        fields = [(0, "off", shape), (1, "i8", _TENSOR_TYPES[t.dtype]), (2, "u32", t.buffer), (3, "off", name)]
        if t.signature is not None:
            fields.append((7, "off", b.CreateNumpyVector(np.array(t.signature, dtype=np.int32))))
        if t.quant is not None:
            scale = b.CreateNumpyVector(np.array(t.quant.scale, dtype=np.float32))
            zero_point = b.CreateNumpyVector(np.array(t.quant.zero_point, dtype=np.int64))
            fields.append((4, "off", _table(b, 7, [(2, "off", scale), (3, "off", zero_point),
                                                    (6, "i32", t.quant.axis)])))
        tensors.append(_table(b, 11, fields))
    operators = []
    for opcode_index, inputs, outputs, options in sg.operators:
        fields = [(0, "u32", opcode_index),
                  (1, "off", b.CreateNumpyVector(np.array(inputs, dtype=np.int32))),
                  (2, "off", b.CreateNumpyVector(np.array(outputs, dtype=np.int32)))]
        if options is not None:
            union_type, option_fields = options
            resolved = [(slot, "off", b.CreateNumpyVector(np.array(value, dtype=np.int32)))
                        if kind == "ivec" else (slot, kind, value) for slot, kind, value in option_fields]
            fields += [(3, "u8", union_type), (4, "off", _table(b, 8, resolved))]
        operators.append(_table(b, 14, fields))
    io = [b.CreateNumpyVector(np.array(v, dtype=np.int32)) for v in (sg.inputs, sg.outputs)]
    name = b.CreateString(sg.name)
    return _table(b, 6, [(0, "off", _offsets(b, tensors)), (1, "off", io[0]), (2, "off", io[1]),
                         (3, "off", _offsets(b, operators)), (4, "off", name)])


def _signature(b: flatbuffers.Builder, key: str, subgraph: int, inputs: dict[str, int],
               outputs: dict[str, int]) -> int:
    maps = []
    for names in (inputs, outputs):
        entries = [_table(b, 2, [(0, "off", b.CreateString(n)), (1, "u32", i)]) for n, i in names.items()]
        maps.append(_offsets(b, entries))
    key_offset = b.CreateString(key)
    return _table(b, 5, [(0, "off", maps[0]), (1, "off", maps[1]), (2, "off", key_offset), (4, "u32", subgraph)])


# Builtin options (union type, fields in schema slot order).
def conv_options(stride: int, act: int = _ACT_NONE) -> Options:
    return 1, ((0, "i8", _SAME), (1, "i32", stride), (2, "i32", stride), (3, "i8", act),
               (4, "i32", 1), (5, "i32", 1))


def depthwise_options(stride: int, act: int = _ACT_NONE) -> Options:
    return 2, ((0, "i8", _SAME), (1, "i32", stride), (2, "i32", stride), (3, "i32", 1), (4, "i8", act),
               (5, "i32", 1), (6, "i32", 1))


def pool_options(size: int) -> Options:
    return 5, ((0, "i8", _VALID), (1, "i32", size), (2, "i32", size), (3, "i32", size), (4, "i32", size),
               (5, "i8", _ACT_NONE))


def add_options(act: int = _ACT_NONE) -> Options:
    return 11, ((0, "i8", act),)


def mul_options() -> Options:
    return 21, ((0, "i8", _ACT_NONE),)


def fc_options() -> Options:
    return 8, ((0, "i8", _ACT_NONE),)


def softmax_options() -> Options:
    return 9, ((0, "f32", 1.0),)


def reshape_options(shape: tuple[int, ...]) -> Options:
    return 17, ((0, "ivec", shape),)


def cnn_weights(seed: int, channels: int = 8, classes: int = 10) -> dict[str, np.ndarray]:
    """The float weights both CNN variants share, from ``seed``."""
    rng = np.random.default_rng(seed)

    def uniform(*shape: int, bound: float) -> np.ndarray:
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)

    return {"conv_w": uniform(channels, 3, 3, 3, bound=0.5), "conv_b": uniform(channels, bound=0.2),
            "dw_w": uniform(1, 3, 3, channels, bound=0.5), "dw_b": uniform(channels, bound=0.2),
            "fc_w": uniform(classes, channels, bound=0.8), "fc_b": uniform(classes, bound=0.2),
            "logit_bias": uniform(classes, bound=0.5)}


def float_cnn(seed: int = 0, size: int = 16) -> bytes:
    """A float32 MobileNet-like block: input ``image [1, size, size, 3]``, output ``probs [1, 10]``."""
    return _cnn(cnn_weights(seed), size, None, "float32")


def quantized_cnn(seed: int = 0, size: int = 16, io_dtype: str = "int8") -> bytes:
    """:func:`float_cnn` quantized to int8; graph input/output are ``io_dtype`` (int8 or uint8).

    Activation ranges come from running the float model through LiteRT on
    uniform [-1, 1) images; the input is quantized with scale 1/128.
    """
    if io_dtype not in ("int8", "uint8"):
        raise ValueError(f"io_dtype must be int8 or uint8, got {io_dtype!r}")
    weights = cnn_weights(seed)
    quant = {name: _activation_quant(lo, hi) for name, (lo, hi) in _calibrate(float_cnn(seed, size)).items()}
    quant["image"] = Quant((1 / 128,), (0,))
    quant["pooled"] = quant["flat"] = quant["residual"]  # pooling and reshape keep their input's quantization
    quant["probs"] = Quant((1 / 256,), (-128,))  # what the int8 SOFTMAX kernel requires
    return _cnn(weights, size, quant, io_dtype)


def _cnn(w: dict[str, np.ndarray], size: int, quant: dict[str, Quant] | None, io_dtype: str) -> bytes:
    """The CNN graph: float when ``quant`` is None, int8 with those activation parameters otherwise."""
    channels, classes, half = w["conv_b"].size, w["fc_b"].size, size // 2
    m = ModelBuilder("float_cnn" if quant is None else f"quantized_cnn_{io_dtype}")
    g = m.subgraph("main")
    dtype = "float32" if quant is None else "int8"

    def act(name: str, shape: tuple[int, ...]) -> int:
        return g.tensor(name, shape, dtype, None if quant is None else quant[name])

    def weights(name: str, axis: int, in_act: str) -> tuple[int, int]:
        """Weight and bias tensors; int8 weights symmetric per ``axis`` (None: per tensor)."""
        if quant is None:
            return g.const(name, w[name]), g.const(name[:-1] + "b", w[name[:-1] + "b"])
        scales = _symmetric_scales(w[name], axis)
        shaped = scales.reshape([-1 if d == axis else 1 for d in range(w[name].ndim)]) if axis is not None else scales
        q_w = np.clip(np.round(w[name] / shaped), -127, 127).astype(np.int8)
        bias_scales = quant[in_act].scale[0] * scales
        q_b = np.round(w[name[:-1] + "b"] / bias_scales).astype(np.int32)
        return (g.const(name, q_w, Quant(tuple(scales), (0,) * scales.size, axis or 0)),
                g.const(name[:-1] + "b", q_b, Quant(tuple(bias_scales), (0,) * scales.size)))

    feature = (1, half, half, channels)
    x = g.input("image", (1, size, size, 3), dtype, None if quant is None else quant["image"])
    if io_dtype == "uint8":
        g.inputs.clear()
        x_u8 = g.input("image_uint8", (1, size, size, 3), "uint8", Quant((1 / 128,), (128,)))
        g.op(QUANTIZE, [x_u8], [x])
    conv, relu, dw, hswish, residual = (act(n, feature) for n in ("conv", "relu6", "dw", "hswish", "residual"))
    g.op(CONV_2D, [x, *weights("conv_w", 0, "image")], [conv], conv_options(2))
    g.op(RELU6, [conv], [relu])
    g.op(DEPTHWISE_CONV_2D, [relu, *weights("dw_w", 3, "relu6")], [dw], depthwise_options(1))
    g.op(HARD_SWISH, [dw], [hswish])
    g.op(ADD, [relu, hswish], [residual], add_options())
    pooled, flat = act("pooled", (1, 1, 1, channels)), act("flat", (1, channels))
    g.op(AVERAGE_POOL_2D, [residual], [pooled], pool_options(half))
    g.op(RESHAPE, [pooled, g.const("flat_shape", np.array([1, channels], np.int32))], [flat],
         reshape_options((1, channels)))
    fc, logits, probs = (act(n, (1, classes)) for n in ("fc", "logits", "probs"))
    g.op(FULLY_CONNECTED, [flat, *weights("fc_w", None, "flat")], [fc], fc_options())
    if quant is None:
        logit_bias = g.const("logit_bias", w["logit_bias"])
    else:
        scale = _symmetric_scales(w["logit_bias"], None)
        logit_bias = g.const("logit_bias", np.round(w["logit_bias"] / scale).astype(np.int8),
                             Quant(tuple(scale), (0,)))
    g.op(ADD, [fc, logit_bias], [logits], add_options())
    g.op(SOFTMAX, [logits], [probs], softmax_options())
    g.outputs.append(probs)
    if io_dtype == "uint8":
        g.outputs[:] = [g.tensor("probs_uint8", (1, classes), "uint8", Quant((1 / 256,), (0,)))]
        g.op(QUANTIZE, [probs], g.outputs[:])
    return m.to_bytes()


def _symmetric_scales(values: np.ndarray, axis: int | None) -> np.ndarray:
    if axis is None:
        return np.array([max(float(np.abs(values).max()), 1e-6) / 127], np.float32)
    reduce = tuple(d for d in range(values.ndim) if d != axis)
    return (np.maximum(np.abs(values).max(axis=reduce), 1e-6) / 127).astype(np.float32)


def _activation_quant(lo: float, hi: float) -> Quant:
    lo, hi = min(lo, 0.0), max(hi, 1e-3)  # the range must hold 0 exactly
    scale = (hi - lo) / 255
    return Quant((scale,), (int(np.clip(round(-128 - lo / scale), -128, 127)),))


def _calibrate(float_model: bytes, samples: int = 32, seed: int = 1) -> dict[str, tuple[float, float]]:
    """Min/max of every named activation of ``float_model`` over random images in [-1, 1)."""
    try:
        from ai_edge_litert import interpreter as litert
    except ImportError:
        from tflite_runtime import interpreter as litert  # type: ignore[no-redef]
    it = litert.Interpreter(model_content=float_model, experimental_preserve_all_tensors=True,
                            experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it.allocate_tensors()
    image = it.get_input_details()[0]
    names = ("conv", "relu6", "dw", "hswish", "residual", "fc", "logits")
    index = {d["name"]: d["index"] for d in it.get_tensor_details() if d["name"] in names}
    ranges = {name: (np.inf, -np.inf) for name in names}
    rng = np.random.default_rng(seed)
    for _ in range(samples):
        it.set_tensor(image["index"], rng.uniform(-1, 1, size=image["shape"]).astype(np.float32))
        it.invoke()
        for name in names:
            value = it.get_tensor(index[name])
            ranges[name] = (min(ranges[name][0], float(value.min())), max(ranges[name][1], float(value.max())))
    return ranges


def two_signature_model() -> bytes:
    """Signatures ``combine(a, b) -> {sum, product}`` on [2, 3] and ``affine(x) -> {y = 3x + 1}`` on [4]."""
    m = ModelBuilder("two_signatures")
    g = m.subgraph("combine")
    a, bb = g.input("combine_a", (2, 3)), g.input("combine_b", (2, 3))
    total, product = g.tensor("combine_sum", (2, 3)), g.tensor("combine_product", (2, 3))
    g.op(ADD, [a, bb], [total], add_options())
    g.op(MUL, [a, bb], [product], mul_options())
    g.outputs += [total, product]
    m.signature("combine", g, {"a": a, "b": bb}, {"sum": total, "product": product})
    h = m.subgraph("affine")
    x, scaled, y = h.input("affine_x", (4,)), h.tensor("affine_scaled", (4,)), h.tensor("affine_y", (4,))
    h.op(MUL, [x, h.const("three", np.full(4, 3.0, np.float32))], [scaled], mul_options())
    h.op(ADD, [scaled, h.const("one", np.ones(4, np.float32))], [y], add_options())
    h.outputs.append(y)
    m.signature("affine", h, {"x": x}, {"y": y})
    return m.to_bytes()


def dynamic_batch_model() -> bytes:
    """``total = a + b`` on ``[batch, 3]`` float32 inputs whose batch is left open (-1)."""
    m = ModelBuilder("dynamic_batch")
    g = m.subgraph("main")
    a, b = (g.input(name, (1, 3), signature=(-1, 3)) for name in ("a", "b"))
    total = g.tensor("total", (1, 3))
    g.op(ADD, [a, b], [total], add_options())
    g.outputs.append(total)
    return m.to_bytes()


MODELS = {
    "float_cnn.tflite": float_cnn,
    "int8_cnn.tflite": lambda: quantized_cnn(io_dtype="int8"),
    "uint8_cnn.tflite": lambda: quantized_cnn(io_dtype="uint8"),
    "two_signatures.tflite": two_signature_model,
    "dynamic_batch.tflite": dynamic_batch_model,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, make in MODELS.items():
        data = make()
        (args.out_dir / name).write_bytes(data)
        print(f"{args.out_dir / name}: {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
