"""An ``optimum`` decoder export rebuilt as ``decoder_fused``'s graph from its own weights.

The folders users have for small LLMs (``optimum`` / onnx-community ``model.onnx``,
``text-generation-with-past``) spell attention out in ~45 nodes a layer, concatenate the
whole past into a new ``present`` every step and compute every position's logits.
``fused_from_export`` reads the weights back out of such a graph — by the names the
exporter gives them — and writes them into our builder's graph (GroupQueryAttention with
rotary inside, packed QKV, SkipSimplifiedLayerNormalization, last-position logits), with the
same inputs and outputs.

Why read the weights rather than pattern-match the attention subgraph: the attention is
spelled differently by every transformers version and attention implementation (eager,
sdpa, mask helpers), while the parameters are not: norms, biases and embeddings keep their
Hugging Face names as initializers, and each linear layer is one ``MatMul`` named after
its module (``/model/layers.3/self_attn/q_proj/MatMul``, TorchScript's scope names) whose
weight is the transposed parameter, or ``Transpose(parameter)`` for a tied head. What is
not recognised raises ``NotFusable`` with the reason; ``same_logits`` is the check that
the rebuilt graph computes what the export computes (``generation.fused_exports`` runs it
before using one).

Only what ``decoder_zoo`` builds is rebuilt: Qwen2, Qwen3 (its own head size, q/k norms) and
Llama (SiLU MLP, RMSNorm, plain rotary or Llama 3's scaled one), float32 weights, weights quantized
by onnxruntime's ``MatMulNBitsQuantizer`` (transformers.js' ``model_q4.onnx``, our
``quantize``), which stay ``MatMulNBits`` as they are (q/k/v and gate/up concatenated along
N), or by its ``quantize_dynamic`` with int8 weights (transformers.js' ``model_quantized.onnx``:
``DynamicQuantizeLinear`` + ``MatMulInteger`` per linear layer, a uint8 embedding table), read as
``Int8Weight``s, the same integers, scales and zero points (its uint8 weight type too, transformers.js'
``model_uint8.onnx``). Other quantized forms (QDQ, ``MatMulIntegerToFloat``), fp16 exports, other
rope scalings (YaRN, dynamic NTK ...), sliding windows and other families keep the export.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

# Ops of quantized forms the rebuild does not read (onnxruntime's quantize_static, its fused forms). Its
# quantize_dynamic's MatMulInteger, DynamicQuantizeLinear and DequantizeLinear are read (see _Weights).
_OTHER_QUANTIZATION = {"QuantizeLinear", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QLinearMatMul",
                       "GatherBlockQuantized"}


class NotFusable(Exception):
    """This export cannot be rebuilt as the fused graph; the message says why (one line)."""


def export_shape(config: dict[str, Any]) -> Any:
    """``decoder_zoo.DecoderShape`` of a Qwen2/Qwen3/Llama ``config.json``; NotFusable for what the builder
    lacks."""
    from edge_runtime.decoder_fused import unfusable
    from edge_runtime.decoder_zoo import shape_from_config

    try:
        shape = shape_from_config(config)
    except ValueError as exc:
        raise NotFusable(str(exc)) from None
    reason = unfusable(shape)
    if reason is not None:
        raise NotFusable(reason)
    return shape


class _Weights:
    """The export's parameters by Hugging Face name (see the module docstring for how they are found):
    each as its [out, in] shape, known from the graph alone, and a loader that reads it (from external
    data under ``base_dir`` where the export keeps it there) only when the builder asks."""

    def __init__(self, proto: Any, base_dir: str = "") -> None:
        self.base_dir = base_dir
        self.initializers = {t.name: t for t in proto.graph.initializer}
        self.nodes = {n.name: n for n in proto.graph.node}
        self.transposed = {n.output[0]: n.input[0] for n in proto.graph.node  # Transpose(parameter) -> parameter
                           if n.op_type == "Transpose" and n.input[0] in self.initializers
                           and [list(a.ints) for a in n.attribute if a.name == "perm"] in ([], [[1, 0]])}

        self.readers: dict[str, list[Any]] = {}
        self.producer: dict[str, Any] = {}
        for node in proto.graph.node:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
            self.producer.update((name, node) for name in node.output)

    def dims(self, name: str) -> tuple[int, ...]:
        from onnx import TensorProto

        tensor = self.initializers[name]
        if tensor.data_type != TensorProto.FLOAT:
            raise NotFusable(f"{name} is {TensorProto.DataType.Name(tensor.data_type)}, not float32 "
                             "(the rebuild takes float32 exports)")
        return tuple(tensor.dims)

    def array(self, name: str) -> np.ndarray:
        from onnx import numpy_helper

        return numpy_helper.to_array(self.initializers[name], self.base_dir)

    def named(self, name: str) -> tuple[tuple[int, ...], Callable[[], Any]]:
        if name not in self.initializers and name + "_quantized" in self.initializers:
            return self.quantized_table(name)
        if name not in self.initializers:
            raise NotFusable(f"no initializer {name!r}")
        return self.dims(name), lambda: self.array(name)

    def quantized_table(self, name: str) -> tuple[tuple[int, ...], Callable[[], Any]]:
        """``quantize_dynamic``'s quantized Gather table (the embedding): ``<name>_quantized`` 8-bit with one
        ``<name>_scale`` and ``<name>_zero_point``, as an ``Int8Weight`` [rows, width]."""
        from edge_runtime.decoder_zoo import Int8Weight

        parts = [name + suffix for suffix in ("_quantized", "_scale", "_zero_point")]
        if not all(part in self.initializers for part in parts):
            raise NotFusable(f"{name} is quantized without the scale and zero point beside it")
        dims = tuple(self.initializers[parts[0]].dims)
        if len(dims) != 2 or self.initializers[parts[1]].dims not in ([], [1]):
            raise NotFusable(f"{name}'s quantized table is {list(dims)} with a scale per row")

        def load() -> Int8Weight:
            rows, zero = dims[0], self.array(parts[2])
            return Int8Weight(self.array(parts[0]), np.full(rows, self.array(parts[1]).reshape(()), np.float32),
                              np.full(rows, zero.reshape(()), zero.dtype))
        return dims, load

    def linear(self, module: str) -> tuple[tuple[int, ...], Callable[[], Any]]:
        """The ``[out, in]`` weight of the linear layer ``module`` (``model.layers.0.self_attn.q_proj``): an
        array, or a ``decoder_zoo.NBitsWeight`` where the export's quantizer made it a ``MatMulNBits``
        (onnxruntime's ``MatMulNBitsQuantizer`` names the node ``<MatMul's name>_Q<bits>``)."""
        path = "/" + module.replace("model.layers.", "model/layers.").replace(".self_attn.", "/self_attn/") \
            .replace(".mlp.", "/mlp/")
        node = self.nodes.get(f"{path}/MatMul")
        quantized = [n for key, n in self.nodes.items() if key.startswith(f"{path}/MatMul_Q")
                     and n.op_type == "MatMulNBits" and n.domain == "com.microsoft"]
        if node is None and len(quantized) == 1:
            return self.nbits(quantized[0])
        integer = self.nodes.get(f"{path}/MatMul_quant")  # quantize_dynamic names it so
        if node is None and integer is not None and integer.op_type == "MatMulInteger":
            return self.integer(integer)
        if node is None:
            kinds = sorted({n.op_type for key, n in self.nodes.items() if key.startswith(path + "/")})
            raise NotFusable(f"no MatMul node {path}/MatMul" + (f" (its nodes: {', '.join(kinds)}: quantized?)"
                                                                 if kinds else ""))
        weight = node.input[1]
        if weight in self.initializers:
            return self.dims(weight)[::-1], lambda: np.ascontiguousarray(self.array(weight).T)
        if weight in self.transposed:
            return self.named(self.transposed[weight])
        raise NotFusable(f"{path}/MatMul's weight {weight!r} is not a constant")

    def nbits(self, node: Any) -> tuple[tuple[int, ...], Callable[[], Any]]:
        from onnx import TensorProto, helper

        from edge_runtime.decoder_zoo import NBitsWeight

        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        inputs = list(node.input) + [""] * (6 - len(node.input))
        if any(inputs[4:]) or not all(name in self.initializers for name in inputs[1:3]) \
                or (inputs[3] and inputs[3] not in self.initializers):
            raise NotFusable(f"{node.name}: a MatMulNBits with g_idx, a bias or non-constant weights")
        scales = self.initializers[inputs[2]]
        if scales.data_type != TensorProto.FLOAT:
            raise NotFusable(f"{node.name}: scales are {TensorProto.DataType.Name(scales.data_type)}, not float32")
        n, k = int(attributes["N"]), int(attributes["K"])

        def load() -> NBitsWeight:
            zero_points = self.array(inputs[3]).reshape(n, -1) if inputs[3] else None
            return NBitsWeight(self.array(inputs[1]), self.array(inputs[2]).reshape(n, -1), zero_points, k,
                               int(attributes.get("bits", 4)), int(attributes["block_size"]),
                               int(attributes.get("accuracy_level", 0)))
        return (n, k), load

    def integer(self, node: Any) -> tuple[tuple[int, ...], Callable[[], Any]]:
        """``quantize_dynamic``'s ``MatMulInteger`` (its activation from ``DynamicQuantizeLinear``, the int32
        product cast to float and multiplied by the activation's scale times the weight's): the weight's
        integers [K, N], zero point and scale (per tensor or per column) as an ``Int8Weight`` [N, K]."""
        from onnx import TensorProto

        from edge_runtime.decoder_zoo import Int8Weight

        inputs = list(node.input) + [""] * (4 - len(node.input))
        weight, scale = inputs[1], self.weight_scale(node)
        if weight not in self.initializers or (inputs[3] and inputs[3] not in self.initializers) or scale is None:
            raise NotFusable(f"{node.name}: a MatMulInteger whose weight, zero point or scale is not a constant")
        tensor = self.initializers[weight]
        if tensor.data_type not in (TensorProto.INT8, TensorProto.UINT8) or len(tensor.dims) != 2:
            raise NotFusable(f"{node.name}: {TensorProto.DataType.Name(tensor.data_type)} weights "
                             f"{list(tensor.dims)} (the rebuild reads 2-D int8 or uint8 ones)")
        k, n = tensor.dims
        # QInt8 weights are symmetric (zero point 0: none kept); QUInt8 ones (model_uint8.onnx) are not
        zero = self.array(inputs[3]) if inputs[3] else None  # a scalar or [N]: small, read now

        def load() -> Int8Weight:
            def columns(values: np.ndarray) -> np.ndarray:
                return np.broadcast_to(values.reshape(-1), (n,)).copy()
            return Int8Weight(np.ascontiguousarray(self.array(weight).T), columns(self.array(scale).astype(np.float32)),
                              columns(zero) if zero is not None and zero.any() else None)
        return (n, k), load

    def weight_scale(self, node: Any) -> str | None:
        """The weight's scale of a ``quantize_dynamic`` ``MatMulInteger``: the constant factor of the ``Mul``
        that makes the product's scale (activation scale x weight scale), after the ``Cast`` to float."""
        activation = self.producer.get(node.input[0])
        casts = self.readers.get(node.output[0], [])
        if activation is None or activation.op_type != "DynamicQuantizeLinear" or len(casts) != 1 \
                or casts[0].op_type != "Cast":
            return None
        for mul in self.readers.get(casts[0].output[0], []):
            for factor in mul.input:
                source = self.producer.get(factor)
                if source is not None and source.op_type == "Mul" and activation.output[1] in source.input:
                    other = [name for name in source.input if name != activation.output[1]]
                    if len(other) == 1 and other[0] in self.initializers:
                        return other[0]
        return None

    def bias(self, module: str) -> tuple[tuple[int, ...], Callable[[], Any]] | None:
        name = module + ".bias"
        return self.named(name) if name in self.initializers else None


class _Lazy(Mapping):
    """Weights by name, each read from the export when the builder asks for it (not kept)."""

    def __init__(self, loaders: dict[str, Callable[[], Any]]) -> None:
        self.loaders = loaders

    def __getitem__(self, name: str) -> Any:
        return self.loaders[name]()

    def __contains__(self, name: object) -> bool:  # without reading the weight
        return name in self.loaders

    def __iter__(self) -> Iterator[str]:
        return iter(self.loaders)

    def __len__(self) -> int:
        return len(self.loaders)


def export_weights(proto: Any, shape: Any, tied: bool, base_dir: str = "") -> Mapping[str, Any]:
    """Hugging Face-named weights of the export ``proto`` (float32 arrays, or ``NBitsWeight``s), read on
    access (external data from ``base_dir``); NotFusable, before anything is read, naming the first
    parameter that is missing, not float32 or not of the shape ``shape`` says."""
    found = _Weights(proto, base_dir)
    kv = shape.kv_heads * shape.head_dim
    expected = {"model.embed_tokens.weight": (shape.vocab, shape.hidden), "model.norm.weight": (shape.hidden,)}
    for n in range(shape.layers):
        p = f"model.layers.{n}."
        expected.update({p + "input_layernorm.weight": (shape.hidden,),
                         p + "post_attention_layernorm.weight": (shape.hidden,),
                         p + "self_attn.q_proj.weight": (shape.heads * shape.head_dim, shape.hidden),
                         p + "self_attn.k_proj.weight": (kv, shape.hidden),
                         p + "self_attn.v_proj.weight": (kv, shape.hidden),
                         p + "self_attn.o_proj.weight": (shape.hidden, shape.heads * shape.head_dim),
                         p + "mlp.gate_proj.weight": (shape.intermediate, shape.hidden),
                         p + "mlp.up_proj.weight": (shape.intermediate, shape.hidden),
                         p + "mlp.down_proj.weight": (shape.hidden, shape.intermediate)})
        if shape.qk_norm:
            expected.update({p + "self_attn.q_norm.weight": (shape.head_dim,),
                             p + "self_attn.k_norm.weight": (shape.head_dim,)})
    if not tied:
        expected["lm_head.weight"] = (shape.vocab, shape.hidden)
    loaders: dict[str, Callable[[], Any]] = {}
    for name, dims in expected.items():
        module = name[: -len(".weight")]
        found_dims, loaders[name] = (found.linear(module) if module.endswith("_proj") or module == "lm_head"
                                     else found.named(name))
        if tuple(found_dims) != dims:
            raise NotFusable(f"{name} is {list(found_dims)}, config.json implies {list(dims)}")
        if module.endswith("_proj"):
            bias = found.bias(module)
            if bias is not None:
                loaders[module + ".bias"] = bias[1]
    return _Lazy(loaders)


def fused_from_export(proto: Any, config: dict[str, Any], base_dir: str = "") -> Any:
    """``decoder_fused``'s graph with the weights of the export ``proto`` (its external data, if not
    loaded, read from ``base_dir`` as the builder goes; inside ``model_zoo.external_weights`` the graph's
    own weights go straight to a file: about one tensor in memory); NotFusable says why not."""
    from edge_runtime.decoder_fused import build_fused_decoder

    shape = export_shape(config)
    found = {n.op_type for n in proto.graph.node}
    if "GroupQueryAttention" in found:
        raise NotFusable("the graph already attends with GroupQueryAttention")
    other = sorted(found & _OTHER_QUANTIZATION)
    if other:
        raise NotFusable(f"its weights are quantized with {', '.join(other)} (only MatMulNBits weights are rebuilt)")
    weights = export_weights(proto, shape, bool(config.get("tie_word_embeddings", False)), base_dir)
    try:
        return build_fused_decoder(shape, weights)
    except ValueError as exc:  # q/k/v biases on some projections only
        raise NotFusable(str(exc)) from None


def dequantized_export(proto: Any) -> Any:
    """``proto`` (changed in place and returned) with every ``quantize_dynamic`` ``MatMulInteger`` of a
    constant weight replaced by a ``MatMul`` of its input and the weight's ``DequantizeLinear``: the
    export's function on the same weights with the activations left in float, which is what a rebuild
    written with ``Int8Weight``s computes before ``per_token_int8`` (the check compares the two there,
    as ``fused_exports`` does MatMulNBits' at accuracy level 0). Nodes left unread are dropped."""
    from onnx import helper

    found = _Weights(proto)
    rewritten: dict[str, list[Any]] = {}  # the Mul whose output a MatMul now writes -> its two nodes
    for node in proto.graph.node:
        if node.op_type != "MatMulInteger":
            continue
        scale = found.weight_scale(node)
        if scale is None or node.input[1] not in found.initializers:
            continue
        activation = found.producer[node.input[0]]
        cast = found.readers[node.output[0]][0]
        mul = next(m for m in found.readers[cast.output[0]] if m.op_type == "Mul")
        zero = [node.input[3]] if len(node.input) > 3 and node.input[3] else []
        axis = {"axis": 1} if found.initializers[scale].dims not in ([], [1]) else {}
        weight = node.name + ".dequantized"
        rewritten[mul.output[0]] = [
            helper.make_node("DequantizeLinear", [node.input[1], scale] + zero, [weight], name=weight, **axis),
            helper.make_node("MatMul", [activation.input[0], weight], [mul.output[0]], name=node.name + ".float")]
    nodes = []
    for node in proto.graph.node:
        nodes.extend(rewritten.get(node.output[0], [node]) if node.op_type == "Mul" else [node])
    live, kept = {o.name for o in proto.graph.output}, []
    for node in reversed(nodes):
        if any(name in live for name in node.output):
            kept.append(node)
            live.update(node.input)
    del proto.graph.node[:]
    proto.graph.node.extend(reversed(kept))
    unread = [t for t in proto.graph.initializer if t.name not in live]
    for tensor in unread:
        proto.graph.initializer.remove(tensor)
    return proto


def same_logits(export_path: str, fused_path: str, vocab: int, *, tokens: int = 12, rtol: float = 1e-3,
                float_weights: bool = False) -> float:
    """Run both graphs on one prompt of ``tokens`` tokens and one decode step after it (the export's
    greedy token, each graph's own ``present``); return the largest logit difference over the
    export's largest logit, NotFusable when it exceeds ``rtol``. ``float_weights``: ONNX Runtime's QDQ
    fusions off, so a ``DequantizeLinear`` of a weight is folded into float32 weights rather than into
    its 8-bit kernel (which quantizes activations)."""
    import onnxruntime as ort

    prompt = np.random.default_rng(0).integers(0, vocab, (1, tokens), dtype=np.int64)
    runs, token = [], 0
    for path in (export_path, fused_path):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 3  # the fused graph's logits_to_keep initializer warns at every load
        if float_weights:
            options.add_session_config_entry("session.disable_quant_qdq", "1")
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        past = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
        feeds: dict[str, np.ndarray] = {"input_ids": prompt, "attention_mask": np.ones_like(prompt),
                                        "position_ids": np.arange(tokens, dtype=np.int64)[None]}
        for item in past:
            dims = [d if isinstance(d, int) else (1 if i == 0 else 0) for i, d in enumerate(item.shape)]
            feeds[item.name] = np.zeros(dims, np.float32)
        names = ["logits"] + [i.name.replace("past_key_values.", "present.") for i in past]
        accepted = {i.name for i in session.get_inputs()}  # an export may take no position_ids
        outputs = session.run(names, {k: v for k, v in feeds.items() if k in accepted})
        first = outputs[0][0, -1]
        token = token if runs else int(np.argmax(first))
        step = {"input_ids": np.array([[token]], np.int64),
                "attention_mask": np.ones((1, tokens + 1), np.int64),
                "position_ids": np.array([[tokens]], np.int64)}
        step.update({item.name: present for item, present in zip(past, outputs[1:])})
        runs.append((first, session.run(["logits"], {k: v for k, v in step.items() if k in accepted})[0][0, -1]))
        del session
    scale = max(1.0, float(np.abs(runs[0][0]).max()))
    worst = max(float(np.abs(a - b).max()) for a, b in zip(runs[0], runs[1])) / scale
    if worst > rtol:
        raise NotFusable(f"the rebuilt graph's logits differ from the export's by {worst:.2e} of the largest "
                         f"(allowed {rtol:.0e})")
    return worst
