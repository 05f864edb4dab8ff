"""The decoder of ``decoder_zoo`` written with ONNX Runtime's fused contrib ops.

Same weights, same inputs and outputs as ``decoder_zoo.build_decoder`` (``input_ids``,
``attention_mask``, ``position_ids``, ``past_key_values.N.key/value``; ``logits``,
``present.N.key/value``), but per layer one packed QKV MatMul, one
``com.microsoft.GroupQueryAttention`` (rotary inside: ``do_rotary`` with cos/sin caches,
positions from ``position_ids``) and ``SkipSimplifiedLayerNormalization`` for each residual
add + RMSNorm pair. About 12 nodes a layer instead of ~45.

What the attention mask means changes: GroupQueryAttention takes per-row lengths
(``seqlens_k``: valid positions - 1) and the batch's longest total, not a mask. The graph
derives both from ``attention_mask`` (its row sums and its width), so a row's valid cache
positions must be its *first* ones (right padding), as ``generation.kv_inplace`` lays them
out — not the left padding of the unfused graph's batch. For one unpadded sequence the two
graphs take identical feeds.

When ``past`` and ``present`` are bound to the same buffer (``[batch, kv_heads, capacity,
head_dim]``), GroupQueryAttention appends each row's new key/value in place at the row's
own length: no per-token copy of the cache. With separate buffers ``present`` is
``past`` plus the new positions, as in the unfused graph (the prefill path).

The VLM decoder (``inputs_embeds=True``: ``inputs_embeds`` [batch, seq, hidden] replaces
``input_ids``) fuses the same way. With 1-D RoPE (Idefics3/SmolVLM) the rotary stays inside
GroupQueryAttention. M-RoPE (Qwen2-VL/Qwen2.5-VL: ``position_ids`` [3, batch, seq]) gives each
rotary channel its angle from one of three positions, which GroupQueryAttention's one-position
rotary cannot express: there the graph rotates the packed query and key heads itself (rotate-half,
as ``decoder_zoo``) and runs GroupQueryAttention with ``do_rotary=0`` (no cos/sin caches); Qwen3-VL's
normed query and key heads are rotated the same way and passed unpacked. Its deepstack sets (a
widened ``inputs_embeds``, ``decoder_zoo.DecoderShape.deepstack``) join the residual with the MLP
output of the first layers, ahead of the next ``SkipSimplifiedLayerNormalization``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from edge_runtime.decoder_zoo import DecoderShape, _Decoder

MS = "com.microsoft"
HEAD_DIM_MULTIPLE = 16  # ONNX Runtime's CPU GroupQueryAttention refuses other head sizes at run time


class _FusedDecoder(_Decoder):
    def simplified_norm(self, x: str, gamma: str, skip: str | None = None) -> tuple[str, str]:
        """(RMSNorm(x [+ skip]) * gamma, x [+ skip]): the normalised value and the new residual."""
        if skip is None:
            # NOTE: decoder_zoo's op chain, which ONNX Runtime fuses into its SimplifiedLayerNormalization;
            # that op itself sits in the default domain without an ONNX schema, so onnx.checker (run on
            # every saved VLM part) would refuse the graph.
            return self.rms_norm(x, gamma), x
        g, weight = self.g, self.const(gamma, self.w[gamma])
        out = g.op("SkipSimplifiedLayerNormalization", [x, skip, weight], 4, domain=MS, epsilon=self.s.rms_eps)
        return out[0], out[3]

    def packed_qkv(self, h: str, prefix: str) -> str:
        """One MatMul (+ bias) giving [batch, seq, (heads + 2 * kv_heads) * head_dim]: GQA's packed query."""
        names = [prefix + f"self_attn.{kind}_proj" for kind in ("q", "k", "v")]
        y = self.project(h, [n + ".weight" for n in names], names[0] + ".packed")
        biases = [self.w.get(n + ".bias") for n in names]
        if all(b is not None for b in biases):
            return self.g.op("Add", [y, self.const(names[0] + ".packed_bias", np.concatenate(biases))])
        if any(b is not None for b in biases):
            raise ValueError(f"some but not all of {names} have biases")
        return y

    def normed_qk(self, packed: str, prefix: str) -> list[str]:
        """Qwen3: the packed projection split into query, key and value (GroupQueryAttention's unpacked
        inputs), the query and key heads each RMS-normalised over their channels (``q_norm``, ``k_norm``)."""
        s, g = self.s, self.g
        sizes = [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim]
        q, k, v = g.op("Split", [packed, self.const("split", np.array(sizes, np.int64))], 3, axis=-1)
        normed = []
        for kind, y, count in (("q", q, s.heads), ("k", k, s.kv_heads)):
            y = g.op("Reshape", [y, self.const("shape", np.array([0, 0, count, s.head_dim], np.int64))])
            y = self.rms_norm(y, prefix + f"self_attn.{kind}_norm.weight")
            normed.append(g.op("Reshape", [y, self.const("shape", np.array([0, 0, count * s.head_dim], np.int64))]))
        return [normed[0], normed[1], v]

    def rotary_caches(self) -> tuple[str, str]:
        """[max_positions, head_dim / 2] cos and sin (GroupQueryAttention's rotate-half layout)."""
        angles = np.outer(np.arange(self.s.max_positions, dtype=np.float64), self.s.inv_freq())
        return (self.const("cos_cache", np.cos(angles).astype(np.float32)),
                self.const("sin_cache", np.sin(angles).astype(np.float32)))

    def mrope_rotary(self) -> tuple[str, str]:
        """[batch, seq, 1, head_dim] M-RoPE cos and sin: ``decoder_zoo``'s angles, laid out to broadcast over
        the heads of a [batch, seq, heads, head_dim] tensor (the packed projection's own layout)."""
        return tuple(self.g.op("Transpose", [t], perm=[0, 2, 1, 3]) for t in self.mrope_cos_sin())

    def rotate_heads(self, y: str, count: int, cos: str, sin: str) -> str:
        """[batch, seq, count * head_dim] with each head rotated by ``mrope_rotary``'s cos/sin, same layout."""
        g, d = self.g, self.s.head_dim
        heads = g.op("Reshape", [y, self.const("shape", np.array([0, 0, count, d], np.int64))])
        return g.op("Reshape", [self.rotate(heads, cos, sin), self.const("shape", np.array([0, 0, -1], np.int64))])

    def rotate_packed(self, packed: str, cos: str, sin: str) -> str:
        """The packed QKV with its query and key heads rotated (the value heads untouched), still packed."""
        s, g = self.s, self.g
        qk, v = g.op("Split", [packed, self.const("split", np.array(
            [(s.heads + s.kv_heads) * s.head_dim, s.kv_heads * s.head_dim], np.int64))], 2, axis=-1)
        heads = g.op("Reshape", [qk, self.const("shape", np.array([0, 0, s.heads + s.kv_heads, s.head_dim], np.int64))])
        rotated = g.op("Reshape", [self.rotate(heads, cos, sin), self.const("shape", np.array([0, 0, -1], np.int64))])
        return g.op("Concat", [rotated, v], axis=-1)

    def build(self) -> onnx.ModelProto:
        s, g = self.s, self.g
        # seqlens_k = valid positions - 1 per row; total_sequence_length = the mask's width (int32).
        lengths = g.op("ReduceSum", ["attention_mask", self.const("ax", np.array([1], np.int64))], keepdims=0)
        seqlens_k = g.op("Cast", [g.op("Sub", [lengths, self.const("one", np.int64(1))])], to=TensorProto.INT32)
        total = g.op("Cast", [g.op("Gather", [g.op("Shape", ["attention_mask"]), self.const("one", np.int64(1))])],
                     to=TensorProto.INT32)
        cos, sin = self.mrope_rotary() if self.mrope else self.rotary_caches()
        x = self.first_hidden()
        h, residual = self.simplified_norm(x, "model.layers.0.input_layernorm.weight")
        inputs, outputs = [], []
        kv_shape = ["batch_size", s.kv_heads, "past_sequence_length", s.head_dim]
        out_shape = ["batch_size", s.kv_heads, "present_sequence_length", s.head_dim]
        for n in range(s.layers):
            p = f"model.layers.{n}."
            past_k, past_v = f"past_key_values.{n}.key", f"past_key_values.{n}.value"
            packed = self.packed_qkv(h, p)
            qkv = self.normed_qk(packed, p) if s.qk_norm else [packed, "", ""]
            if self.mrope and s.qk_norm:  # Qwen3-VL: normed, then rotated here, unpacked
                q, k, v = qkv
                rotary = [self.rotate_heads(q, s.heads, cos, sin), self.rotate_heads(k, s.kv_heads, cos, sin), v,
                          past_k, past_v, seqlens_k, total]
            elif self.mrope:  # rotated here; GroupQueryAttention only attends
                rotary = [self.rotate_packed(packed, cos, sin), "", "", past_k, past_v, seqlens_k, total]
            else:
                rotary = [*qkv, past_k, past_v, seqlens_k, total, cos, sin, "position_ids"]
            attended = g.op("GroupQueryAttention", rotary, 3, domain=MS, num_heads=s.heads, kv_num_heads=s.kv_heads,
                            do_rotary=0 if self.mrope else 1, rotary_interleaved=0)
            g.nodes[-1].output[1], g.nodes[-1].output[2] = f"present.{n}.key", f"present.{n}.value"
            attended = self.post_norm(self.linear(attended[0], p + "self_attn.o_proj"),
                                      p + "post_self_attn_layernorm.weight")
            h, residual = self.simplified_norm(attended, p + "post_attention_layernorm.weight", residual)
            gate, up = self.fused_linear(h, [p + "mlp.gate_proj", p + "mlp.up_proj"])
            act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
            following = f"model.layers.{n + 1}.input_layernorm.weight" if n + 1 < s.layers else "model.norm.weight"
            mlp_out = self.post_norm(self.linear(act, p + "mlp.down_proj"), p + "post_mlp_layernorm.weight")
            if n < s.deepstack:  # Qwen3-VL: this layer's deepstack set joins the residual stream
                mlp_out = g.op("Add", [mlp_out, self.deepstack_rows[n]])
            h, residual = self.simplified_norm(mlp_out, following, residual)
            inputs += [helper.make_tensor_value_info(past_k, TensorProto.FLOAT, kv_shape),
                       helper.make_tensor_value_info(past_v, TensorProto.FLOAT, kv_shape)]
            outputs += [helper.make_tensor_value_info(f"present.{n}.key", TensorProto.FLOAT, out_shape),
                        helper.make_tensor_value_info(f"present.{n}.value", TensorProto.FLOAT, out_shape)]
        keep = self.lm_head(h)
        first = self.first_input()
        positions = ([3] if self.mrope else []) + ["batch_size", "sequence_length"]
        graph_inputs = [
            first,
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, positions)]
        logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "logits_length", s.vocab])
        graph = helper.make_graph(g.nodes, "qwen2_style_fused_decoder", graph_inputs + inputs + [keep], [logits] + outputs,
                                  g.initializers)
        # NOTE: onnx.checker passes it but cannot check the com.microsoft nodes (it has no schemas for
        # them); ONNX Runtime validates those when it loads the graph (the tests load every variant).
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                                  producer_name="edge-runtime-decoder-fused")
        model.ir_version = 8
        return model


def unfusable(shape: DecoderShape) -> str | None:
    """Why ONNX Runtime cannot run the fused graph of ``shape`` (one line), or None when it can."""
    if shape.head_dim % HEAD_DIM_MULTIPLE:
        return (f"head_dim {shape.head_dim} is not a multiple of {HEAD_DIM_MULTIPLE} "
                "(ONNX Runtime's GroupQueryAttention needs one)")
    return None


def build_fused_decoder(shape: DecoderShape, weights: dict[str, np.ndarray], *, inputs_embeds: bool = False,
                        mrope_section: tuple[int, ...] | None = None) -> onnx.ModelProto:
    """The fused decoder graph (see the module docstring) for Hugging Face-named Qwen2/Llama ``weights``;
    ``inputs_embeds`` and ``mrope_section`` as in ``decoder_zoo.build_decoder`` (same inputs and outputs).
    ValueError when ``unfusable(shape)`` says why not, or when the weights have biases on some but not
    all of q/k/v."""
    reason = unfusable(shape)
    if reason is not None:
        raise ValueError(f"no fused decoder for this shape: {reason}")
    return _FusedDecoder(shape, weights, inputs_embeds, mrope_section).build()

