"""Vision towers of the Qwen2-VL family written with ``onnx.helper`` (no torch), from Hugging Face weights.

``build_qwen2_vl_vision(spec, weights)`` emits the transformers.js ``vision_encoder``
graph: inputs ``pixel_values`` [patches, 3*2*14*14] (the image processor's flattened
patches, every 4 consecutive rows one 2x2 merge block) and ``grid_thw`` [images, 3];
output ``image_features`` [patches / merge², hidden]. Inside, as transformers'
``Qwen2VisionTransformerPretrainedModel``: patch embedding (the Conv3d whose kernel equals
its stride is a MatMul of the flattened patches), blocks of LayerNorm, full attention
with 2-D rotary embeddings, quick-GELU MLP, then the patch merger (LayerNorm, 2x2 merge,
GELU MLP). Attention is confined to each frame (transformers' ``cu_seqlens``).

Two forms of attention, the same numbers (``fused``):

* portable (``fused=False``): MatMul, Add of a [patches, patches] bias, Softmax, MatMul
  in standard ops, so every backend of a ``gpu`` plan (OpenCL, Vulkan) can take it.
* fused (``fused=True``): ONNX Runtime's ``com.microsoft`` ``MultiHeadAttention``. When
  the call holds a single frame (one image: the host encodes one at a time) an ``If``
  takes the bias-free branch, which ORT's CPU kernel runs as flash attention: no
  [heads, patches, patches] score tensors (at ~1,000 image tokens, 3,700 patches, those
  are 3 x 330 MB written and read per block) and no bias built at all; several frames
  take the branch with the bias. Runs wherever ONNX Runtime does (transformers.js's
  onnxruntime-node included); OpenCL/Vulkan cannot take it, so the engine loads a fused
  encoder on plan ``cpu`` (``generation.vision.encoder``).

Rotary positions are computed *inside the graph* from ``grid_thw`` (no host-side
tables): every patch finds its image by comparing its index with the running sum of
t*h*w, then its (row, column) from the merge-block order. Several images per call work.

``weights`` are named as a saved checkpoint names them (``visual.blocks.0.attn.qkv.weight``...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from edge_runtime.model_zoo import IN_MEMORY_CHECK_BYTES, OPSET, _GraphBuilder, initializer_bytes


@dataclass(frozen=True)
class QwenVisionSpec:
    """The ``vision_config`` fields the graph needs (transformers' names in comments)."""

    depth: int = 2
    embed_dim: int = 32          # embed_dim
    heads: int = 4               # num_heads
    mlp_hidden: int = 128        # int(embed_dim * mlp_ratio)
    out_hidden: int = 64         # hidden_size: the text model's width
    patch: int = 14              # patch_size
    temporal: int = 2            # temporal_patch_size
    merge: int = 2               # spatial_merge_size
    channels: int = 3            # in_channels
    act: str = "quick_gelu"      # hidden_act

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.heads

    @property
    def patch_values(self) -> int:
        return self.channels * self.temporal * self.patch * self.patch

    def config(self) -> dict:
        """``vision_config`` as transformers writes it."""
        return {"model_type": "qwen2_vl", "depth": self.depth, "embed_dim": self.embed_dim,
                "hidden_size": self.out_hidden, "hidden_act": self.act, "mlp_ratio": self.mlp_hidden / self.embed_dim,
                "num_heads": self.heads, "in_channels": self.channels, "patch_size": self.patch,
                "spatial_merge_size": self.merge, "temporal_patch_size": self.temporal}


def qwen_vision_spec(config: dict) -> QwenVisionSpec:
    """The spec from a ``Qwen2VLForConditionalGeneration`` config's ``vision_config``."""
    v = config["vision_config"]
    return QwenVisionSpec(depth=v["depth"], embed_dim=v["embed_dim"], heads=v["num_heads"],
                          mlp_hidden=int(v["embed_dim"] * v.get("mlp_ratio", 4)), out_hidden=v["hidden_size"],
                          patch=v.get("patch_size", 14), temporal=v.get("temporal_patch_size", 2),
                          merge=v.get("spatial_merge_size", 2), channels=v.get("in_channels", 3),
                          act=v.get("hidden_act", "quick_gelu"))


class VisionGraph:
    """Small helpers over ``_GraphBuilder`` shared by the vision towers: linear, norms, activations."""

    def __init__(self, weights: dict[str, np.ndarray], fused: bool = False) -> None:
        self.w = weights
        self.g = _GraphBuilder(0)
        self.fused = fused

    def const(self, name: str, value: np.ndarray | np.generic) -> str:
        return self.g.const(name, np.asarray(value))

    def ints(self, *values: int) -> str:
        return self.const("ints", np.array(values, np.int64))

    def linear(self, x: str, name: str) -> str:
        y = self.g.op("MatMul", [x, self.const(name, np.ascontiguousarray(self.w[name + ".weight"].T))])
        bias = self.w.get(name + ".bias")
        return self.g.op("Add", [y, self.const(name + ".bias", bias)]) if bias is not None else y

    def layer_norm(self, x: str, name: str, eps: float) -> str:
        return self.g.op("LayerNormalization", [x, self.const(name, self.w[name + ".weight"]),
                                                self.const(name + ".bias", self.w[name + ".bias"])],
                         axis=-1, epsilon=eps)

    def rms_norm(self, x: str, name: str, eps: float) -> str:
        g = self.g
        variance = g.op("ReduceMean", [g.op("Mul", [x, x])], axes=[-1], keepdims=1)
        norm = g.op("Div", [x, g.op("Sqrt", [g.op("Add", [variance, self.const("eps", np.float32(eps))])])])
        return g.op("Mul", [norm, self.const(name, self.w[name + ".weight"])])

    def act(self, x: str, kind: str) -> str:
        """The activation ``kind`` of transformers' ``ACT2FN``, in the op chains ONNX Runtime fuses at load:
        ``x * sigmoid(1.702 x)`` becomes one ``QuickGelu``, ``x * (erf(x / sqrt 2) + 1) * 0.5`` (Div, not a Mul
        by 1/sqrt 2, which it leaves as five kernels) one ``Gelu``. Its CPU fusions miss the tanh form, so a
        fused graph writes ``com.microsoft.FastGelu`` itself (one kernel for the chain's nine: 2.0 against
        10.3 ms on [4096, 1536], 2 threads) and a portable one the standard ops."""
        g = self.g
        if kind == "quick_gelu":
            return g.op("Mul", [x, g.op("Sigmoid", [g.op("Mul", [x, self.const("k", np.float32(1.702))])])])
        if kind in ("gelu", "gelu_exact"):
            inner = g.op("Erf", [g.op("Div", [x, self.const("sqrt2", np.float32(np.sqrt(2)))])])
            return g.op("Mul", [g.op("Mul", [x, g.op("Add", [inner, self.const("one", np.float32(1.0))])]),
                                self.const("half", np.float32(0.5))])
        if kind in ("gelu_pytorch_tanh", "gelu_new") and self.fused:
            return g.op("FastGelu", [x], domain="com.microsoft")
        if kind in ("gelu_pytorch_tanh", "gelu_new"):
            cube = g.op("Mul", [g.op("Mul", [x, x]), x])
            inner = g.op("Add", [x, g.op("Mul", [cube, self.const("c", np.float32(0.044715))])])
            inner = g.op("Tanh", [g.op("Mul", [inner, self.const("s", np.float32(np.sqrt(2 / np.pi)))])])
            return g.op("Mul", [g.op("Mul", [x, self.const("half", np.float32(0.5))]),
                                g.op("Add", [inner, self.const("one", np.float32(1.0))])])
        if kind == "silu":
            return g.op("Mul", [x, g.op("Sigmoid", [x])])
        raise ValueError(f"activation {kind!r} is not supported: expected quick_gelu, gelu, gelu_pytorch_tanh or silu")

    def rotate(self, x: str, cos: str, sin: str, head_dim: int) -> str:
        """Rotate-half rotary embedding: ``x*cos + rotate_half(x)*sin``."""
        g = self.g
        first, second = g.op("Split", [x, self.ints(head_dim // 2, head_dim // 2)], 2, axis=-1)
        rotated = g.op("Concat", [g.op("Neg", [second]), first], axis=-1)
        return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rotated, sin])])

    def same(self, key: str) -> str:
        """[patches, patches] bool: patch i and patch j have equal ``key``."""
        g = self.g
        return g.op("Equal", [g.op("Unsqueeze", [key, self.ints(1)]), g.op("Unsqueeze", [key, self.ints(0)])])

    def bias(self, allowed: str) -> str:
        """0 where attention is allowed, else -30000: its exp() is 0 in float32 as that of transformers'
        finfo.min is, and an fp16 variant keeps headroom (fp16 conversion clamps -1e9 to -65504, where
        adding a negative score already overflows to -inf)."""
        open_, closed = self.const("open", np.float32(0.0)), self.const("closed", np.float32(-30000.0))
        return self.g.op("Where", [allowed, open_, closed])

    def attention(self, q: str, k: str, v: str, bias: str | None, head_dim: int) -> str:
        """Softmax attention over [..., heads, seq, dim] tensors; ``bias`` is added to the scores."""
        g = self.g
        scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
        scores = g.op("Mul", [scores, self.const("scale", np.float32(head_dim ** -0.5))])
        if bias is not None:
            scores = g.op("Add", [scores, bias])
        return g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])

    def branch(self, name: str, build: Callable[[], str]) -> onnx.GraphProto:
        """A subgraph (for ``If``) of the nodes ``build`` emits; its output is what ``build`` returns.
        Constants it makes go to the main graph (visible from the branch as outer-scope names)."""
        outer, self.g.nodes = self.g.nodes, []
        try:
            out = build()
            return helper.make_graph(self.g.nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT,
                                                                                             None)])
        finally:
            self.g.nodes = outer

    def if_(self, cond: str, then: Callable[[], str], otherwise: Callable[[], str]) -> str:
        return self.g.op("If", [cond], then_branch=self.branch(self.g.name("then"), then),
                         else_branch=self.branch(self.g.name("else"), otherwise))

    def mha(self, q: str, k: str, v: str, heads: int, bias: str | None = None, key_mask: str | None = None) -> str:
        """ONNX Runtime's ``MultiHeadAttention`` over [batch, seq, heads*dim] q/k/v (scale 1/sqrt(dim));
        ``bias`` [batch|1, 1, seq, seq] float added to the scores, ``key_mask`` [batch, seq] int32 (0: a
        key nobody attends to). Without either, ORT's CPU kernel runs flash attention."""
        inputs = [q, k, v]
        if bias is not None or key_mask is not None:
            inputs += ["", key_mask or "", bias or ""]
        # -30000 as ``bias()``: exp() of it is 0 in float32 and an fp16 variant keeps headroom
        return self.g.op("MultiHeadAttention", inputs, domain="com.microsoft", num_heads=heads,
                         mask_filter_value=-30000.0)

    def finish(self, name: str, inputs: list[onnx.ValueInfoProto],
               outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        """The model; a fused graph also imports the ``com.microsoft`` domain of its contrib ops."""
        if not self.fused:
            return self.g.model(name, inputs, outputs)
        graph = helper.make_graph(self.g.nodes, name, inputs, outputs, self.g.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                        helper.make_opsetid("com.microsoft", 1)],
                                  producer_name="edge-runtime-make-models")
        model.ir_version = 8  # as _GraphBuilder.model: readable by every onnxruntime release we support
        external = any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)
        if not external and initializer_bytes(model) < IN_MEMORY_CHECK_BYTES:  # else checked once saved
            onnx.checker.check_model(model)
        return model


class _QwenVision(VisionGraph):
    def __init__(self, spec: QwenVisionSpec, weights: dict[str, np.ndarray], grid_name: str,
                 fused: bool = False) -> None:
        super().__init__(weights, fused)
        self.s = spec
        self.grid = grid_name

    def positions(self) -> tuple[str, str]:
        """(cos, sin) [1, patches, head_dim] of the 2-D rotary embedding; notes each patch's frame and merge
        block (``self.frame``, ``block_row``, ``block_col``) and whether the call holds one frame (``single``)."""
        g, s, m = self.g, self.s, self.s.merge
        col = {axis: g.op("Gather", [self.grid, self.const("axis", np.int64(axis))], axis=1) for axis in range(3)}
        t, h, w = col[0], col[1], col[2]
        sizes = g.op("Mul", [g.op("Mul", [t, h]), w])
        ends = g.op("CumSum", [sizes, self.const("axis0", np.int64(0))])
        starts = g.op("Sub", [ends, sizes])
        count = g.op("Gather", [g.op("Shape", ["pixel_values"]), self.const("zero", np.int64(0))])
        index = g.op("Range", [self.const("zero", np.int64(0)), count, self.const("one", np.int64(1))])
        # the image of each patch: how many images end at or before it
        after = g.op("GreaterOrEqual", [g.op("Unsqueeze", [index, self.ints(1)]),
                                        g.op("Unsqueeze", [ends, self.ints(0)])])
        image = g.op("ReduceSum", [g.op("Cast", [after], to=TensorProto.INT64), self.ints(1)], keepdims=0)
        # Total on any input (the planner probes with synthetic grids): a grid that does not match the
        # patch count gives garbage rather than an out-of-range Gather, and no integer division by zero
        # (which would kill the process). The host checks rows == sum(t*h*w) before it encodes.
        last = g.op("Sub", [g.op("Gather", [g.op("Shape", [self.grid]), self.const("zero", np.int64(0))]),
                            self.const("one", np.int64(1))])
        image = g.op("Min", [image, last])
        at_least_one = self.const("one", np.int64(1))
        hh, ww = (g.op("Max", [g.op("Gather", [side_len, image]), at_least_one]) for side_len in (h, w))
        local = g.op("Sub", [index, g.op("Gather", [starts, image])])
        area = g.op("Mul", [hh, ww])
        within = g.op("Mod", [local, area])
        side, square = self.const("m", np.int64(m)), self.const("mm", np.int64(m * m))
        # patch order inside a frame: (block row, block column, row in block, column in block)
        in_col = g.op("Mod", [within, side])
        in_row = g.op("Mod", [g.op("Div", [within, side]), side])
        blocks_w = g.op("Max", [g.op("Div", [ww, side]), at_least_one])
        block = g.op("Div", [within, square])
        block_col, block_row = g.op("Mod", [block, blocks_w]), g.op("Div", [block, blocks_w])
        row = g.op("Add", [g.op("Mul", [block_row, side]), in_row])
        column = g.op("Add", [g.op("Mul", [block_col, side]), in_col])
        self.row, self.column, self.sides = row, column, (hh, ww)  # GLM-4.1V's position table reads them
        rc = g.op("Concat", [g.op("Unsqueeze", [row, self.ints(1)]), g.op("Unsqueeze", [column, self.ints(1)])],
                  axis=1)
        rc = g.op("Cast", [rc], to=TensorProto.FLOAT)
        # transformers: freqs = outer(pos, inv_freq) over dim = head_dim/2, [row freqs, column freqs] twice
        quarter = s.head_dim // 4
        inv = (1.0 / (np.float32(10000.0) ** (np.arange(0, s.head_dim // 2, 2, dtype=np.float32)
                                               / np.float32(s.head_dim // 2)))).astype(np.float32)
        select = np.zeros((2, s.head_dim), np.float32)
        for half in (0, s.head_dim // 2):
            select[0, half:half + quarter] = inv
            select[1, half + quarter:half + 2 * quarter] = inv
        angles = g.op("Unsqueeze", [g.op("MatMul", [rc, self.const("rope_freq", select)]), self.ints(0)])
        # attention stays within one frame: global frame number = frames of earlier images + frame in image
        frame_ends = g.op("CumSum", [t, self.const("axis0", np.int64(0))])
        frame = g.op("Add", [g.op("Gather", [g.op("Sub", [frame_ends, t]), image]), g.op("Div", [local, area])])
        self.frame, self.block_row, self.block_col = frame, block_row, block_col  # for the biases
        # for windowed attention (Qwen2.5-VL): per image t, h, w; per patch its image, frame in the image,
        # row and column in its merge block
        self.grid_cols, self.image = (t, h, w), image
        self.frame_in_image, self.in_row, self.in_col = g.op("Div", [local, area]), in_row, in_col
        if self.fused:  # one frame in the call (the host's case: one image): no bias needed
            frames = g.op("ReduceSum", [t, self.ints(0)], keepdims=0)
            self.single = g.op("Equal", [frames, self.const("one", np.int64(1))])
        return g.op("Cos", [angles]), g.op("Sin", [angles])

    def resampled_table(self, weight: str, coordinate: Callable[[str, str], str], mode: str,
                        align_corners: int) -> str:
        """[patches, embed]: the learned square position table ``weight`` ([side², embed]) sampled at each patch's
        place in its image by ONNX ``GridSample`` (``mode``, border padding); ``coordinate(index, sides)`` maps
        a patch's column (row) and its image's columns (rows) to GridSample's [-1, 1]. GLM-4.1V's and
        Qwen3-VL's tables; ``positions`` must have run (it finds the rows, columns and sides)."""
        g, embed = self.g, self.s.embed_dim
        values = self.w[weight]
        side = int(round(values.shape[0] ** 0.5))
        table = values.reshape(side, side, embed).transpose(2, 0, 1)[None]  # [1, C, S, S]
        table = self.const("position_table", np.ascontiguousarray(table))
        h, w = self.sides
        x, y = coordinate(self.column, w), coordinate(self.row, h)
        grid = g.op("Concat", [g.op("Unsqueeze", [x, self.ints(1)]), g.op("Unsqueeze", [y, self.ints(1)])], axis=1)
        grid = g.op("Unsqueeze", [grid, self.ints(0, 2)])  # [1, patches, 1, 2]: (x, y) per patch
        sampled = g.op("GridSample", [table, grid], mode=mode, padding_mode="border", align_corners=align_corners)
        return g.op("Transpose", [g.op("Reshape", [sampled, self.ints(embed, -1)])], perm=[1, 0])

    def rotary_caches(self, cos: str, sin: str) -> tuple[str, str]:
        """The fused blocks' rotary: ONNX Runtime's ``RotaryEmbedding`` (rotate-half) with one cache row per
        patch (``positions``' [1, patches, head_dim] cos/sin cut to their unique first half) and position
        ids 0..patches-1 (``self.rope_positions``). One kernel per q and per k instead of six element-wise
        ops over them (Split, Neg, Concat, Mul, Mul, Add): measured on 920 patches x 6 heads of 64, the
        op 0.11 ms against the chain's ~0.4 ms per tensor, 16 tensors an encoder."""
        g, half = self.g, self.s.head_dim // 2
        count = g.op("Gather", [g.op("Shape", ["pixel_values"]), self.const("zero", np.int64(0))])
        self.rope_positions = g.op("Unsqueeze", [g.op("Range", [self.const("zero", np.int64(0)), count,
                                                                self.const("one", np.int64(1))]), self.ints(0)])
        return tuple(g.op("Reshape", [g.op("Slice", [t, self.ints(0), self.ints(half), self.ints(2)]),
                                      self.ints(-1, half)]) for t in (cos, sin))

    def frame_bias(self) -> str:
        """[patches, patches]: 0 within a frame, -30000 across frames."""
        return self.bias(self.same(self.frame))

    def block_biases(self) -> list[str | None]:
        """Per block the bias its attention adds (fused: [1, 1, patches, patches]); None: attention
        within each frame, Qwen2-VL's in every block."""
        return [None] * self.s.depth

    def norm(self, x: str, name: str) -> str:
        return self.layer_norm(x, name, 1e-6)

    def mlp(self, x: str, prefix: str) -> str:
        return self.linear(self.act(self.linear(x, prefix + "mlp.fc1"), self.s.act), prefix + "mlp.fc2")

    def block(self, x: str, n: int, cos: str, sin: str, bias: str | None, frame_bias: str) -> str:
        g, s, d = self.g, self.s, self.s.head_dim
        p = f"visual.blocks.{n}."
        h = self.norm(x, p + "norm1")
        if self.fused:
            qkv = g.op("Reshape", [self.linear(h, p + "attn.qkv"), self.ints(0, 3, s.heads, d)])  # [patches, 3, h, d]
            q, k, v = g.op("Split", [qkv, self.ints(1, 1, 1)], 3, axis=1)
            q, k, v = (g.op("Reshape", [t, self.ints(1, -1, s.embed_dim)]) for t in (q, k, v))
            q, k = (g.op("RotaryEmbedding", [t, self.rope_positions, cos, sin], domain="com.microsoft",
                         num_heads=s.heads, interleaved=0) for t in (q, k))
            out = g.op("Reshape", [self.attend(n, q, k, v, bias, frame_bias), self.ints(-1, s.embed_dim)])
        else:
            qkv = g.op("Reshape", [self.linear(h, p + "attn.qkv"), self.ints(0, 3, s.heads, d)])
            qkv = g.op("Transpose", [qkv], perm=[1, 2, 0, 3])  # [3, heads, patches, dim]
            q, k, v = g.op("Split", [qkv, self.ints(1, 1, 1)], 3, axis=0)
            q, k = self.rotate(q, cos, sin, d), self.rotate(k, cos, sin, d)
            out = self.attention(q, k, v, frame_bias if bias is None else bias, d)  # [1, heads, patches, dim]
            out = g.op("Reshape", [g.op("Transpose", [out], perm=[0, 2, 1, 3]), self.ints(-1, s.embed_dim)])
        x = g.op("Add", [x, self.linear(out, p + "attn.proj")])
        return g.op("Add", [x, self.mlp(self.norm(x, p + "norm2"), p)])

    def attend(self, n: int, q: str, k: str, v: str, bias: str | None, frame_bias: str) -> str:
        """Fused attention of block ``n`` over [1, patches, embed] q/k/v: within each frame (flash when the
        call holds one frame), or with ``bias`` [1, 1, patches, patches]."""
        heads = self.s.heads
        if bias is not None:
            return self.mha(q, k, v, heads, bias=bias)
        return self.if_(self.single, lambda: self.mha(q, k, v, heads),
                        lambda: self.mha(q, k, v, heads, bias=frame_bias))

    def build(self) -> onnx.ModelProto:
        g, s = self.g, self.s
        kernel = self.w["visual.patch_embed.proj.weight"].reshape(s.embed_dim, -1)
        x = g.op("MatMul", ["pixel_values", self.const("patch_embed", np.ascontiguousarray(kernel.T))])
        x = self.blocks(x, *self.positions())
        x = self.norm(x, "visual.merger.ln_q")
        x = g.op("Reshape", [x, self.ints(-1, s.embed_dim * s.merge * s.merge)])
        x = self.linear(self.act(self.linear(x, "visual.merger.mlp.0"), "gelu"), "visual.merger.mlp.2")
        return self.finish_encoder()

    def blocks(self, x: str, cos: str, sin: str, after: Callable[[int, str], object] | None = None) -> str:
        """``x`` through every block, with ``positions``' rotary ``cos``/``sin`` and the biases of
        ``block_biases``; ``after(n, out)`` is called with each block's output (Qwen3-VL's DeepStack taps)."""
        g = self.g
        biases = self.block_biases()
        if not self.fused:
            frame_bias = self.frame_bias() if None in biases else ""
        else:
            cos, sin = self.rotary_caches(cos, sin)
            # built only when several frames share the call (the If's other branch is a dummy)
            frame_bias = self.if_(self.single, lambda: g.op("Identity", [self.const("unused", np.zeros((1, 1, 1, 1),
                                                                                                        np.float32))]),
                                  lambda: g.op("Unsqueeze", [self.frame_bias(), self.ints(0, 1)])
                                  ) if None in biases else ""
        for n, block_bias in enumerate(biases):
            x = self.block(x, n, cos, sin, block_bias, frame_bias)
            if after is not None:
                after(n, x)
        return x

    def finish_encoder(self, width: int | None = None) -> onnx.ModelProto:
        """The model, the last node's output named ``image_features`` [tokens, ``width``: the text hidden size
        unless given]; inputs ``pixel_values`` and the grid."""
        s = self.s
        self.g.nodes[-1].output[0] = "image_features"
        inputs = [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["num_patches", s.patch_values]),
                  helper.make_tensor_value_info(self.grid, TensorProto.INT64, ["num_images", 3])]
        out = helper.make_tensor_value_info("image_features", TensorProto.FLOAT,
                                            ["num_image_tokens", width or s.out_hidden])
        return self.finish(f"{s.config()['model_type']}_vision_encoder", inputs, [out])


def build_qwen2_vl_vision(spec: QwenVisionSpec, weights: dict[str, np.ndarray], grid_name: str = "grid_thw",
                          fused: bool = False) -> onnx.ModelProto:
    """The Qwen2-VL ``vision_encoder`` graph (see the module docstring; ``fused``: ORT's attention op)."""
    return _QwenVision(spec, weights, grid_name, fused).build()
