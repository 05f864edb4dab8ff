"""A Qwen2-architecture decoder written with ``onnx.helper``: no torch, same contract as ``optimum``.

``build_decoder(shape, weights)`` emits the graph an ``optimum``
``text-generation-with-past`` export has: inputs ``input_ids`` [batch, seq],
``attention_mask`` [batch, past + seq], ``position_ids`` [batch, seq],
``past_key_values.N.key/value`` [batch, kv_heads, past, head_dim]; outputs
``logits`` [batch, seq, vocab] and ``present.N.key/value``. Inside: RMSNorm,
q/k/v projections with biases, rotary embeddings (rotate-half), grouped-query
attention with a causal and padding mask, SwiGLU MLP, tied embeddings.
``weights`` use Hugging Face's parameter names, so a test can load a
``transformers`` Qwen2 state dict and compare logits.

``write_decoder_folder`` writes a complete model folder (weights at random
from a seed, a tokenizer trained locally) for ``edge-runtime demo`` and the
benchmarks: the installed package builds it without torch. It and
``decoder_folder_from_hf`` write ``decoder_fused``'s graph (GroupQueryAttention,
KV appended in place) by default where ONNX Runtime can run it, this module's
plain graph with ``fused=False`` (and always for the VLM's decoder).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edge_runtime.generation.folder import LOGITS_TO_KEEP
from edge_runtime.model_zoo import _GraphBuilder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecoderShape:
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    vocab: int = 2048
    max_positions: int = 1024
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    # Llama 3's rope scaling ("rope_type": "llama3"): (factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings); None: plain rotary
    rope_llama3: tuple[float, float, float, int] | None = None
    # Qwen3: a head size of its own (0 = hidden / heads) and an RMSNorm over each query and key head
    # (``self_attn.q_norm`` / ``k_norm``, [head_dim]) before the rotary
    attention_head_dim: int = 0
    qk_norm: bool = False
    # GLM-4 (GLM-4.1V's text model): the rotary turns only the first ``rotary_dim`` channels of a head
    # (0 = all; ``partial_rotary_factor`` * head_dim), in adjacent pairs (``rotary_interleaved``: channels
    # 2i and 2i+1, not i and i + half), and each sub-layer's output is RMS-normalised before its residual
    # add (``post_norms``: ``post_self_attn_layernorm`` / ``post_mlp_layernorm``). Built with M-RoPE only.
    rotary_dim: int = 0
    rotary_interleaved: bool = False
    post_norms: bool = False
    # Qwen3-VL: the M-RoPE frequencies interleaved over t/h/w (frequency i takes axis i % 3 while i is
    # inside that axis's ``mrope_section``, else t) instead of in contiguous sections; and ``deepstack``
    # vision feature sets, each added to the hidden states after one of the first ``deepstack`` layers.
    # They ride in ``inputs_embeds``, widened to ``hidden * (1 + deepstack)`` (see ``vlm_parts``): the
    # first ``hidden`` channels are the embedding, then one ``hidden`` slice per set (zero on text rows).
    mrope_interleaved: bool = False
    deepstack: int = 0

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden // self.heads

    @property
    def embeds_width(self) -> int:
        """Channels of ``inputs_embeds``: the hidden size, times (1 + deepstack) for Qwen3-VL."""
        return self.hidden * (1 + self.deepstack)

    @property
    def rotated_dim(self) -> int:
        """Channels of a head the rotary turns."""
        return self.rotary_dim or self.head_dim

    def inv_freq(self) -> np.ndarray:
        """The rotary frequencies of the ``head_dim / 2`` channel pairs (float64), with Llama 3's scaling
        where set: wavelengths longer than ``original / low_freq_factor`` slowed by ``factor``, shorter
        than ``original / high_freq_factor`` kept, those between blended (transformers' formula)."""
        d = self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
        if self.rope_llama3 is None:
            return inv_freq
        factor, low, high, original = self.rope_llama3
        wavelen = 2 * np.pi / inv_freq
        scaled = np.where(wavelen > original / low, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        return np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def shape_from_config(config: dict) -> DecoderShape:
    """The ``DecoderShape`` of a Hugging Face Qwen2/Qwen3/Llama ``config.json``; ValueError (one line) for
    what this builder cannot reproduce: another family or activation, rope scaling other than Llama 3's,
    a sliding window, partial rotary, ``head_dim`` other than hidden / heads outside Qwen3."""
    family = config.get("model_type")
    if family not in FAMILIES:
        raise ValueError(f"model_type {family!r} is not one of {', '.join(FAMILIES)}")
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ("default", "llama3"):
        raise ValueError(f"rope_scaling {scaling} (plain rotary and Llama 3's scaling only)")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {config.get('hidden_act')!r} is not silu")
    if config.get("use_sliding_window"):
        raise ValueError("use_sliding_window is on (the graph attends to the whole context)")
    if float(config.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"partial_rotary_factor {config['partial_rotary_factor']} (rotary over every channel only)")
    try:
        heads = int(config["num_attention_heads"])
        llama3 = None if kind == "default" else (
            float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"]),
            int(scaling["original_max_position_embeddings"]))
        shape = DecoderShape(hidden=int(config["hidden_size"]), layers=int(config["num_hidden_layers"]), heads=heads,
                             kv_heads=int(config.get("num_key_value_heads") or heads),
                             intermediate=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
                             max_positions=int(config["max_position_embeddings"]),
                             rope_theta=float(config.get("rope_theta", 10000.0)),
                             rms_eps=float(config.get("rms_norm_eps", 1e-6)), rope_llama3=llama3,
                             attention_head_dim=int(config.get("head_dim") or 0) if family == "qwen3" else 0,
                             qk_norm=family == "qwen3")
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"config.json lacks or garbles {exc}") from None
    if config.get("head_dim") not in (None, shape.head_dim):
        raise ValueError(f"head_dim {config['head_dim']} is not hidden_size / num_attention_heads = {shape.head_dim}")
    return shape


@dataclass(frozen=True)
class NBitsWeight:
    """A linear layer's weight already in ONNX Runtime's ``MatMulNBits`` form (read from a quantized
    export by ``decoder_from_export``): ``packed`` [N, blocks, blob] uint8, ``scales`` [N, blocks],
    ``zero_points`` [N, bytes] uint8 or None, and the op's attributes. The builder emits it as one
    ``MatMulNBits``; weights of one input (q/k/v, gate/up) concatenate along N into one."""

    packed: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    k: int
    bits: int
    block_size: int
    accuracy_level: int

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K): the [out, in] shape of the weight it stands for, as a Hugging Face parameter's."""
        return self.packed.shape[0], self.k

    def attributes(self) -> tuple[int, int, int, int]:
        return self.k, self.bits, self.block_size, self.accuracy_level


@dataclass(frozen=True)
class Int8Weight:
    """A linear layer's (or the embedding's) weight as 8-bit integers with one scale per output (read
    from an export onnxruntime's ``quantize_dynamic`` wrote, transformers.js' ``model_quantized.onnx`` or
    ``model_uint8.onnx``): ``q`` [N, K] int8 or uint8, ``scale`` [N] float32, ``zero_point`` [N] of
    ``q``'s type or None (0). It stands for ``(q - zero_point) * scale[:, None]``. The builder emits it
    as ``DequantizeLinear`` (per output column) before the MatMul, the exact weights in standard ONNX;
    ``per_token_int8`` turns that into ``MatMulInteger`` on the same integers."""

    q: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.q.shape[1]

    def dequantized(self) -> np.ndarray:
        """The float32 [N, K] weights, as ``DequantizeLinear`` computes them."""
        q = self.q.astype(np.int32)
        if self.zero_point is not None:
            q = q - self.zero_point.astype(np.int32)[:, None]
        return q.astype(np.float32) * self.scale[:, None]


FAMILIES = ("qwen2", "qwen3", "llama")


def random_weights(shape: DecoderShape, seed: int = 0, std: float = 0.2) -> dict[str, np.ndarray]:
    """Hugging Face-named Qwen2 weights; ``std`` ~0.2 keeps greedy output varied (0.02 repeats a token)."""
    rng = np.random.default_rng(seed)
    h, kv, i = shape.hidden, shape.kv_heads * shape.head_dim, shape.intermediate
    q = shape.heads * shape.head_dim

    def normal(*dims: int, scale: float = std) -> np.ndarray:
        return (rng.standard_normal(dims) * scale).astype(np.float32)

    weights = {"model.embed_tokens.weight": normal(shape.vocab, h), "model.norm.weight": 1 + normal(h, scale=0.2)}
    for n in range(shape.layers):
        p = f"model.layers.{n}."
        weights.update({
            p + "input_layernorm.weight": 1 + normal(h, scale=0.2),
            p + "post_attention_layernorm.weight": 1 + normal(h, scale=0.2),
            p + "self_attn.q_proj.weight": normal(q, h), p + "self_attn.q_proj.bias": normal(q, scale=0.1),
            p + "self_attn.k_proj.weight": normal(kv, h), p + "self_attn.k_proj.bias": normal(kv, scale=0.1),
            p + "self_attn.v_proj.weight": normal(kv, h), p + "self_attn.v_proj.bias": normal(kv, scale=0.1),
            p + "self_attn.o_proj.weight": normal(h, q),
            p + "mlp.gate_proj.weight": normal(i, h), p + "mlp.up_proj.weight": normal(i, h),
            p + "mlp.down_proj.weight": normal(h, i),
        })
        if shape.qk_norm:
            weights.update({p + "self_attn.q_norm.weight": 1 + normal(shape.head_dim, scale=0.2),
                            p + "self_attn.k_norm.weight": 1 + normal(shape.head_dim, scale=0.2)})
    return weights


class _Decoder:
    def __init__(self, shape: DecoderShape, weights: dict[str, np.ndarray], inputs_embeds: bool = False,
                 mrope_section: tuple[int, ...] | None = None) -> None:
        self.s = shape
        self.w = weights
        self.g = _GraphBuilder(0)
        self.embeds = inputs_embeds
        self.mrope = tuple(mrope_section) if mrope_section else None
        if self.mrope and 2 * sum(self.mrope) != shape.rotated_dim:
            raise ValueError(f"mrope_section {list(self.mrope)} sums to {sum(self.mrope)}; expected half the rotated "
                             f"channels, {shape.rotated_dim // 2}")
        if (shape.rotary_dim or shape.rotary_interleaved or shape.mrope_interleaved) and not self.mrope:
            raise ValueError("partial or interleaved rotary is built with M-RoPE (GLM-4.1V, Qwen3-VL) only")
        if shape.deepstack and not inputs_embeds:
            raise ValueError("deepstack features ride in inputs_embeds: a decoder with them takes embeddings")
        if shape.deepstack > shape.layers:
            raise ValueError(f"{shape.deepstack} deepstack feature sets for {shape.layers} layers")
        if shape.rotated_dim > shape.head_dim or shape.rotated_dim % 2:
            raise ValueError(f"rotary_dim {shape.rotary_dim} must be even and at most head_dim {shape.head_dim}")

    def const(self, name: str, value: np.ndarray) -> str:
        return self.g.const(name, value)

    def first_hidden(self) -> str:
        """The hidden states entering layer 0: ``inputs_embeds`` (its first ``hidden`` channels when it carries
        deepstack sets, which go to ``self.deepstack_rows``), or the embedding of ``input_ids``."""
        self.deepstack_rows: list[str] = []
        if not self.embeds:
            return self.embedding()
        if not self.s.deepstack:
            return "inputs_embeds"
        sizes = self.const("split", np.full(1 + self.s.deepstack, self.s.hidden, np.int64))
        x, *self.deepstack_rows = self.g.op("Split", ["inputs_embeds", sizes], 1 + self.s.deepstack, axis=-1)
        return x

    def first_input(self) -> onnx.ValueInfoProto:
        if self.embeds:
            return helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT,
                                                 ["batch_size", "sequence_length", self.s.embeds_width])
        return helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])

    def lm_head(self, x: str) -> onnx.ValueInfoProto:
        """``logits`` from the final hidden states ``x``, of the last ``logits_to_keep`` positions only (0, its
        default: every position, transformers' convention); returns that input's value info.

        NOTE: a prefill needs the last position's logits only, but the head over every position costs
        ``vocab x hidden`` per token (a sixth of a 2B model's prefill at Qwen2's 151,936-token vocabulary)
        and a [chunk, vocab] float32 output. ``logits_to_keep`` is an input backed by an initializer, so
        a runtime that does not know it (transformers.js) never has to feed it and gets every position."""
        g = self.g
        g.initializers.append(numpy_helper.from_array(np.array(0, np.int64), LOGITS_TO_KEEP))
        start = g.op("Neg", [g.op("Unsqueeze", [LOGITS_TO_KEEP, self.const("axes", np.array([0], np.int64))])])
        kept = g.op("Slice", [x, start, self.const("end", np.array([np.iinfo(np.int64).max], np.int64)),
                              self.const("axes", np.array([1], np.int64))])
        head = "lm_head.weight" if "lm_head.weight" in self.w else "model.embed_tokens.weight"  # tied unless given
        self.project(kept, [head], "lm_head")
        g.nodes[-1].output[0] = "logits"
        return helper.make_tensor_value_info(LOGITS_TO_KEEP, TensorProto.INT64, [])

    def project(self, x: str, names: list[str], label: str) -> str:
        """``x`` times the weights ``names`` (Hugging Face [out, in] arrays, or ``NBitsWeight``s) stacked
        along their outputs: one MatMul, or one ``MatMulNBits`` for quantized ones (one pass over ``x``)."""
        weights = [self.w[n] for n in names]
        if all(isinstance(w, Int8Weight) for w in weights):
            return self.g.op("MatMul", [x, self.dequantize_columns(label, weights)])
        if not any(isinstance(w, (NBitsWeight, Int8Weight)) for w in weights):
            return self.g.op("MatMul", [x, self.const(label, np.ascontiguousarray(np.concatenate(weights, axis=0).T))])
        if any(isinstance(w, Int8Weight) for w in weights):
            raise ValueError(f"{names} mix float or MatMulNBits weights with 8-bit integer ones")
        if not all(isinstance(w, NBitsWeight) for w in weights) or len({w.attributes() for w in weights}) > 1:
            raise ValueError(f"{names} mix float and quantized weights or MatMulNBits settings")
        first = weights[0]
        inputs = [x, self.const(label + "_Q", np.concatenate([w.packed for w in weights])),
                  self.const(label + "_scales", np.concatenate([w.scales for w in weights]))]
        if any(w.zero_points is not None for w in weights):
            if not all(w.zero_points is not None for w in weights):
                raise ValueError(f"{names}: zero points on some weights only")
            inputs.append(self.const(label + "_zero_points", np.concatenate([w.zero_points for w in weights])))
        return self.g.op("MatMulNBits", inputs, domain="com.microsoft", K=first.k,
                         N=sum(w.shape[0] for w in weights), bits=first.bits, block_size=first.block_size,
                         accuracy_level=first.accuracy_level)

    def dequantize_columns(self, label: str, weights: list[Int8Weight]) -> str:
        """``Int8Weight``s stacked along their outputs as one [K, N] weight: ``DequantizeLinear`` with a scale
        (and zero point) per column, which ONNX Runtime folds into its 8-bit kernel and ``per_token_int8``
        rewrites as ``MatMulInteger``."""
        if len({w.q.dtype for w in weights}) > 1 or len({w.zero_point is None for w in weights}) > 1:
            raise ValueError(f"{label}: 8-bit weights of different types or zero points stacked together")
        inputs = [self.const(label + ".int8", np.ascontiguousarray(np.concatenate([w.q for w in weights]).T)),
                  self.const(label + ".int8_scale", np.concatenate([w.scale for w in weights]).astype(np.float32))]
        if weights[0].zero_point is not None:
            inputs.append(self.const(label + ".int8_zero_point", np.concatenate([w.zero_point for w in weights])))
        return self.g.op("DequantizeLinear", inputs, axis=1)

    def embedding(self) -> str:
        """The rows of ``input_ids`` from the embedding table: a Gather, and for an ``Int8Weight`` table with
        one scale for all of it (``quantize_dynamic``'s Gather) a Gather of its integers then
        ``DequantizeLinear``, so the table stays 8-bit in memory as in the export."""
        table = self.w["model.embed_tokens.weight"]
        if not isinstance(table, Int8Weight):
            return self.g.op("Gather", [self.const("model.embed_tokens.weight", table), "input_ids"])
        zero = table.zero_point if table.zero_point is not None else np.zeros(1, table.q.dtype)
        if np.ptp(table.scale) or np.ptp(zero):  # a scale per row: no per-tensor form, so dequantize it here
            return self.g.op("Gather", [self.const("model.embed_tokens.weight", table.dequantized()), "input_ids"])
        name = "model.embed_tokens.weight.int8"
        rows = self.g.op("Gather", [self.const(name, table.q), "input_ids"])
        return self.g.op("DequantizeLinear", [rows, self.const(name + "_scale", table.scale[:1].reshape(())),
                                              self.const(name + "_zero_point", zero[:1].reshape(()))])

    def linear(self, x: str, name: str) -> str:
        """``x @ W.T (+ b)``; the bias is optional (Qwen2 has q/k/v biases, Llama none)."""
        y = self.project(x, [name + ".weight"], name)
        bias = self.w.get(name + ".bias")
        return self.g.op("Add", [y, self.const(name + ".bias", bias)]) if bias is not None else y

    def fused_linear(self, x: str, names: list[str]) -> list[str]:
        """Several projections of one input as one MatMul (one pass over ``x``, one kernel), then Split."""
        weights = [self.w[n + ".weight"] for n in names]
        y = self.project(x, [n + ".weight" for n in names], names[0] + ".fused")
        if all(n + ".bias" in self.w for n in names):
            y = self.g.op("Add", [y, self.const(names[0] + ".fused_bias", np.concatenate(
                [self.w[n + ".bias"] for n in names]))])
        elif any(n + ".bias" in self.w for n in names):
            raise ValueError(f"some but not all of {names} have biases")
        sizes = self.const("split", np.array([w.shape[0] for w in weights], np.int64))
        return self.g.op("Split", [y, sizes], len(names), axis=-1)

    def post_norm(self, x: str, name: str) -> str:
        """GLM-4's RMSNorm of a sub-layer's output before its residual add (``post_norms``), else ``x``."""
        return self.rms_norm(x, name) if self.s.post_norms else x

    def rms_norm(self, x: str, name: str) -> str:
        # NOTE: exactly the Pow/ReduceMean/Add/Sqrt/Div/Mul chain ONNX Runtime fuses into one
        # SimplifiedLayerNormalization kernel; an equivalent spelling (x*x, Reciprocal) stays six ops.
        g = self.g
        variance = g.op("ReduceMean", [g.op("Pow", [x, self.const("two", np.float32(2.0))])], axes=[-1], keepdims=1)
        norm = g.op("Div", [x, g.op("Sqrt", [g.op("Add", [variance, self.const("eps", np.float32(self.s.rms_eps))])])])
        return g.op("Mul", [norm, self.const(name, self.w[name])])

    def rotate(self, x: str, cos: str, sin: str) -> str:
        """``x * cos + rotate(x) * sin`` over a 4-D tensor's last axis (head channels); ``cos`` / ``sin`` span
        the rotated channels. Rotate-half pairs channel i with i + half; interleaved (GLM) pairs 2i with
        2i + 1; channels past ``rotary_dim`` pass through."""
        g, s = self.g, self.s
        rotated_dim, d = s.rotated_dim, s.head_dim
        passed = None
        if rotated_dim < d:
            x, passed = g.op("Split", [x, self.const("split", np.array([rotated_dim, d - rotated_dim], np.int64))],
                             2, axis=-1)
        if s.rotary_interleaved:
            pairs = g.op("Reshape", [x, self.const("shape", np.array([0, 0, 0, -1, 2], np.int64))])
            even, odd = g.op("Split", [pairs, self.const("split", np.array([1, 1], np.int64))], 2, axis=-1)
            rotated = g.op("Reshape", [g.op("Concat", [g.op("Neg", [odd]), even], axis=-1),
                                       self.const("shape", np.array([0, 0, 0, rotated_dim], np.int64))])
        else:
            half = rotated_dim // 2
            first, second = g.op("Split", [x, self.const("split", np.array([half, half], np.int64))], 2, axis=-1)
            rotated = g.op("Concat", [g.op("Neg", [second]), first], axis=-1)
        out = g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rotated, sin])])
        return out if passed is None else g.op("Concat", [out, passed], axis=-1)

    def cos_sin(self) -> tuple[str, str]:
        """[batch, 1, seq, head_dim] cos and sin gathered from tables by ``position_ids`` [batch, seq]."""
        g = self.g
        angles = np.outer(np.arange(self.s.max_positions, dtype=np.float64), self.s.inv_freq())
        angles = np.concatenate([angles, angles], axis=-1)
        axis1 = self.const("axis1", np.array([1], np.int64))
        tables = [self.const(name, fn(angles).astype(np.float32)) for name, fn in (("cos", np.cos), ("sin", np.sin))]
        cos, sin = (g.op("Unsqueeze", [g.op("Gather", [table, "position_ids"]), axis1]) for table in tables)
        return cos, sin

    def mrope_cos_sin(self) -> tuple[str, str]:
        """M-RoPE (Qwen2-VL): ``position_ids`` [3, batch, seq] holds temporal/height/width positions; the
        rotary channels come in ``mrope_section`` chunks (twice over, for both halves) taking their
        angle from axis 0, 1, 2, 0, 1, 2. One MatMul of the positions with a [3, head_dim] matrix that
        holds each channel's frequency in its axis's row (zeros elsewhere) gives every angle: the
        same single float32 product as transformers' ``inv_freq @ position_ids``, so no table bounds.
        GLM-4.1V (``rotary_interleaved``): frequency i of the ``rotary_dim`` rotated channels takes its axis
        from ``mrope_section`` over the first half and turns channels 2i and 2i + 1. Qwen3-VL
        (``mrope_interleaved``): frequency i takes axis i % 3 while i < 3 * that axis's section, else t
        (transformers' ``apply_interleaved_mrope``)."""
        g, d = self.g, self.s.rotated_dim
        inv_freq = (1.0 / (np.float32(self.s.rope_theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))))
        if self.s.rotary_interleaved:  # GLM: frequency i's section by the first half, on channels 2i and 2i + 1
            inv_freq = np.repeat(inv_freq, 2).astype(np.float32)
            axis = np.repeat(np.concatenate([np.full(n, i) for i, n in enumerate(self.mrope)]), 2)
        elif self.s.mrope_interleaved:  # Qwen3-VL: frequency i from axis i % 3 within that axis's section
            inv_freq = np.concatenate([inv_freq, inv_freq]).astype(np.float32)
            frequency = np.arange(d // 2)
            axis = np.where((frequency % 3 > 0) & (frequency < 3 * np.asarray(self.mrope)[frequency % 3]),
                            frequency % 3, 0)
            axis = np.concatenate([axis, axis])
        else:
            inv_freq = np.concatenate([inv_freq, inv_freq]).astype(np.float32)
            axis = np.concatenate([np.full(n, i % 3) for i, n in enumerate(self.mrope * 2)])
        select = np.where(axis[None, :] == np.arange(3)[:, None], inv_freq[None, :], 0).astype(np.float32)
        positions = g.op("Transpose", [g.op("Cast", ["position_ids"], to=TensorProto.FLOAT)], perm=[1, 2, 0])
        angles = g.op("MatMul", [positions, self.const("mrope_freq", select)])  # [batch, seq, head_dim]
        angles = g.op("Unsqueeze", [angles, self.const("axis1", np.array([1], np.int64))])
        return g.op("Cos", [angles]), g.op("Sin", [angles])

    def build(self) -> onnx.ModelProto:
        s, g = self.s, self.g
        d, rep = s.head_dim, s.heads // s.kv_heads
        cos, sin = self.mrope_cos_sin() if self.mrope else self.cos_sin()
        # Mask [batch, 1, 1, seq, total]: key j is visible to query i when j <= past + i and not padding.
        total = g.op("Gather", [g.op("Shape", ["attention_mask"]), self.const("one", np.int64(1))])
        source = "inputs_embeds" if self.embeds else "input_ids"
        seq = g.op("Gather", [g.op("Shape", [source]), self.const("one", np.int64(1))])
        past = g.op("Sub", [total, seq])
        zero, one = self.const("zero", np.int64(0)), self.const("step", np.int64(1))
        q_pos = g.op("Unsqueeze", [g.op("Range", [past, total, one]), self.const("ax", np.array([1], np.int64))])
        k_pos = g.op("Range", [zero, total, one])
        causal = g.op("LessOrEqual", [k_pos, q_pos])  # [seq, total]
        keep = g.op("Cast", ["attention_mask"], to=TensorProto.BOOL)
        keep = g.op("Unsqueeze", [keep, self.const("ax", np.array([1], np.int64))])  # [batch, 1, total]
        allowed = g.op("And", [causal, keep])  # [batch, seq, total]
        allowed = g.op("Unsqueeze", [allowed, self.const("ax", np.array([1, 2], np.int64))])
        bias = g.op("Where", [allowed, self.const("open", np.float32(0.0)), self.const("closed", np.float32(-1e9))])
        x = self.first_hidden()
        inputs, outputs = [], []
        for n in range(s.layers):
            p = f"model.layers.{n}."
            h = self.rms_norm(x, p + "input_layernorm.weight")
            heads = {}
            kinds = (("q", s.heads), ("k", s.kv_heads), ("v", s.kv_heads))
            projected = self.fused_linear(h, [p + f"self_attn.{kind}_proj" for kind, _ in kinds])
            for (kind, count), y in zip(kinds, projected):
                y = g.op("Reshape", [y, self.const("shape", np.array([0, 0, count, d], np.int64))])
                if s.qk_norm and kind != "v":  # Qwen3: RMSNorm over each head's channels
                    y = self.rms_norm(y, p + f"self_attn.{kind}_norm.weight")
                heads[kind] = g.op("Transpose", [y], perm=[0, 2, 1, 3])  # [batch, heads, seq, dim]
            q, k = self.rotate(heads["q"], cos, sin), self.rotate(heads["k"], cos, sin)
            past_k, past_v = f"past_key_values.{n}.key", f"past_key_values.{n}.value"
            present_k = g.op("Concat", [past_k, k], axis=2)
            present_v = g.op("Concat", [past_v, heads["v"]], axis=2)
            g.nodes[-2].output[0], g.nodes[-1].output[0] = f"present.{n}.key", f"present.{n}.value"
            present_k, present_v = f"present.{n}.key", f"present.{n}.value"
            # GQA without repeating K/V: queries grouped per KV head, [batch, kv_heads, rep, seq, dim].
            q5 = g.op("Reshape", [q, self.const("shape", np.array([0, s.kv_heads, rep, -1, d], np.int64))])
            k5 = g.op("Unsqueeze", [present_k, self.const("ax", np.array([2], np.int64))])
            v5 = g.op("Unsqueeze", [present_v, self.const("ax", np.array([2], np.int64))])
            scores = g.op("MatMul", [q5, g.op("Transpose", [k5], perm=[0, 1, 2, 4, 3])])
            scores = g.op("Add", [g.op("Mul", [scores, self.const("scale", np.float32(1 / np.sqrt(d)))]), bias])
            attended = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v5])
            attended = g.op("Reshape", [attended, self.const("shape", np.array([0, s.heads, -1, d], np.int64))])
            attended = g.op("Reshape", [g.op("Transpose", [attended], perm=[0, 2, 1, 3]),
                                        self.const("shape", np.array([0, 0, s.heads * d], np.int64))])
            x = g.op("Add", [x, self.post_norm(self.linear(attended, p + "self_attn.o_proj"),
                                               p + "post_self_attn_layernorm.weight")])
            h = self.rms_norm(x, p + "post_attention_layernorm.weight")
            gate, up = self.fused_linear(h, [p + "mlp.gate_proj", p + "mlp.up_proj"])
            act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
            x = g.op("Add", [x, self.post_norm(self.linear(act, p + "mlp.down_proj"), p + "post_mlp_layernorm.weight")])
            if n < s.deepstack:
                x = g.op("Add", [x, self.deepstack_rows[n]])
            kv_shape = ["batch_size", s.kv_heads, "past_sequence_length", d]
            out_shape = ["batch_size", s.kv_heads, "past_sequence_length + sequence_length", d]
            inputs += [helper.make_tensor_value_info(past_k, TensorProto.FLOAT, kv_shape),
                       helper.make_tensor_value_info(past_v, TensorProto.FLOAT, kv_shape)]
            outputs += [helper.make_tensor_value_info(present_k, TensorProto.FLOAT, out_shape),
                        helper.make_tensor_value_info(present_v, TensorProto.FLOAT, out_shape)]
        keep = self.lm_head(self.rms_norm(x, "model.norm.weight"))
        positions = ([3] if self.mrope else []) + ["batch_size", "sequence_length"]
        graph_inputs = [self.first_input(),
                        helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                                      ["batch_size", "past_sequence_length + sequence_length"]),
                        helper.make_tensor_value_info("position_ids", TensorProto.INT64, positions)]
        logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "logits_length", s.vocab])
        return g.model("qwen2_style_decoder", graph_inputs + inputs + [keep], [logits] + outputs)


def build_decoder(shape: DecoderShape, weights: dict[str, np.ndarray], *, inputs_embeds: bool = False,
                  mrope_section: tuple[int, ...] | None = None) -> onnx.ModelProto:
    """The decoder graph (see the module docstring); weights are stored as initializers.

    ``inputs_embeds=True``: the first input is ``inputs_embeds`` [batch, seq, hidden] instead of
    ``input_ids`` (the VLM ``decoder_model_merged``; no embedding table inside). ``mrope_section``
    (Qwen2-VL's ``rope_scaling.mrope_section``): ``position_ids`` is [3, batch, seq] (M-RoPE).
    Without q/k/v biases in ``weights`` the attention is Llama's."""
    return _Decoder(shape, weights, inputs_embeds, mrope_section).build()


def _graph(shape: DecoderShape, weights: dict[str, np.ndarray], fused: bool) -> onnx.ModelProto:
    """The fused graph when asked and ONNX Runtime can run it for ``shape``, else the plain one."""
    if fused:
        from edge_runtime.decoder_fused import build_fused_decoder, unfusable

        reason = unfusable(shape)
        if reason is None:
            return build_fused_decoder(shape, weights)
        log.info("writing the unfused decoder graph: %s", reason)
    return build_decoder(shape, weights)


def decoder_folder_from_hf(hf_folder: Path, out: Path, *, fused: bool = True) -> Path:
    """Our graph for a Hugging Face Qwen2/Qwen3/Llama folder (``config.json`` + ``model.safetensors`` or its
    shards; float32, float16 or bfloat16), no torch.

    The leaner alternative to an ``optimum`` export (about half the nodes once ONNX Runtime has
    optimised both: no shape subgraphs, grouped-query attention without repeated K/V), written
    with the same inputs and outputs. Tokenizer and generation files are copied. ``fused``
    (default): the ``decoder_fused`` graph (GroupQueryAttention, KV appended in place; measured
    faster, same greedy tokens) where ONNX Runtime can run it for the shape
    (``decoder_fused.unfusable``), else the plain-ONNX one; ``fused=False``: always the plain one.
    Weights are read as the builder uses them and written straight to ``model.onnx.data``
    (``model_zoo.external_weights``), so a multi-GB checkpoint is never held whole in memory.
    ValueError names what this builder cannot reproduce (``shape_from_config``).
    """
    import shutil

    from edge_runtime.model_zoo import external_weights
    from edge_runtime.vision_convert import read_checkpoint

    hf_folder, out = Path(hf_folder), Path(out)
    config = json.loads((hf_folder / "config.json").read_text())
    try:
        shape = shape_from_config(config)
    except ValueError as exc:
        raise ValueError(f"{hf_folder}: {exc}") from None
    weights = read_checkpoint(hf_folder)  # float32 on access
    if config.get("tie_word_embeddings"):
        weights = _Without(weights, "lm_head.weight")
    out.mkdir(parents=True, exist_ok=True)
    with external_weights(out / "model.onnx.data"):
        graph = _graph(shape, weights, fused)
    onnx.save(graph, str(out / "model.onnx"))
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja", "special_tokens_map.json"):
        if (hf_folder / name).is_file():
            shutil.copyfile(hf_folder / name, out / name)
    return out


class _Without(Mapping):
    """``weights`` without ``name`` (a tied checkpoint's stored copy of its head)."""

    def __init__(self, weights: Mapping, name: str) -> None:
        self.weights, self.name = weights, name

    def __getitem__(self, key: str) -> np.ndarray:
        if key == self.name:
            raise KeyError(key)
        return self.weights[key]

    def __contains__(self, key: object) -> bool:  # without decoding the weight
        return key != self.name and key in self.weights

    def __iter__(self):
        return (k for k in self.weights if k != self.name)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def write_decoder_folder(folder: Path, shape: DecoderShape, seed: int = 0, std: float = 0.2, *,
                         fused: bool = True) -> Path:
    """A complete optimum-layout folder with random weights and a locally trained tokenizer.

    ``std`` as in ``random_weights``: 0.2 keeps greedy output varied; about 0.02 (Hugging Face's
    initialiser) gives activations and logits of a trained model's scale, for quantization drift.
    ``fused`` as in ``decoder_folder_from_hf``."""
    from edge_runtime.tokenizer_zoo import write_tokenizer_files

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    bos, eos = write_tokenizer_files(folder, shape.vocab, "qwen2", seed=seed, max_positions=shape.max_positions)
    onnx.save(_graph(shape, random_weights(shape, seed, std), fused), str(folder / "model.onnx"))
    config = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": shape.vocab,
              "hidden_size": shape.hidden, "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
              "num_key_value_heads": shape.kv_heads, "intermediate_size": shape.intermediate,
              "max_position_embeddings": shape.max_positions, "rope_theta": shape.rope_theta,
              "rms_norm_eps": shape.rms_eps, "tie_word_embeddings": True, "bos_token_id": bos, "eos_token_id": eos,
              "edge_runtime_builder": asdict(shape)}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos}))
    return folder
