"""Idefics3 / SmolVLM vision tower + connector written with ``onnx.helper`` (no torch), from Hugging Face weights.

``build_idefics3_vision(spec, weights)`` emits the transformers.js ``vision_encoder``:
inputs ``pixel_values`` [batch, tiles, 3, H, W] and ``pixel_attention_mask`` bool
[batch, tiles, H, W]; output ``image_features`` [real tiles, image_seq_len, text hidden].
As transformers' ``Idefics3Model.get_image_features``: tiles that are all zeros (batch
padding) are dropped (one is kept if none is real), the pixel mask becomes a patch mask
(a patch counts when any of its pixels does), the SigLIP-style tower runs (conv patch
embedding, learned position embeddings indexed by the bucketed fractional patch
coordinates of each tile's valid area, LayerNorm, attention with padded patches masked
as keys, gelu-tanh MLP, post LayerNorm), then the connector (pixel shuffle by
``scale_factor``, one linear projection).

``fused=True`` writes the attention as ONNX Runtime's ``MultiHeadAttention`` (see
``edge_runtime.vision_graphs``): an ``If`` runs it without a mask (flash attention on
ORT's CPU) when every patch of every tile is valid (one image's tiles always are),
else with the key padding mask.

``weights`` use the checkpoint's names (``model.vision_model.*``, ``model.connector.*``).
H and W must equal ``image_size`` (the processor's tiles always do).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from edge_runtime.vision_graphs import VisionGraph


@dataclass(frozen=True)
class IdeficsVisionSpec:
    """``vision_config`` fields (transformers' names in comments) and the connector's ``scale_factor``."""

    layers: int = 2              # num_hidden_layers
    hidden: int = 32             # hidden_size
    heads: int = 4               # num_attention_heads
    intermediate: int = 64       # intermediate_size
    image_size: int = 32         # image_size: the tile side in pixels
    patch: int = 4               # patch_size
    channels: int = 3            # num_channels
    act: str = "gelu_pytorch_tanh"
    eps: float = 1e-6            # layer_norm_eps
    scale_factor: int = 2        # the top-level config's scale_factor
    text_hidden: int = 64        # text_config.hidden_size

    @property
    def side(self) -> int:
        return self.image_size // self.patch

    @property
    def image_seq_len(self) -> int:
        return self.side ** 2 // self.scale_factor ** 2

    def config(self) -> dict:
        return {"model_type": "idefics3_vision", "num_hidden_layers": self.layers, "hidden_size": self.hidden,
                "num_attention_heads": self.heads, "intermediate_size": self.intermediate,
                "image_size": self.image_size, "patch_size": self.patch, "num_channels": self.channels,
                "hidden_act": self.act, "layer_norm_eps": self.eps}


def idefics_vision_spec(config: dict) -> IdeficsVisionSpec:
    v, text = config["vision_config"], config.get("text_config") or config
    return IdeficsVisionSpec(layers=v["num_hidden_layers"], hidden=v["hidden_size"], heads=v["num_attention_heads"],
                             intermediate=v["intermediate_size"], image_size=v["image_size"], patch=v["patch_size"],
                             channels=v.get("num_channels", 3), act=v.get("hidden_act", "gelu_pytorch_tanh"),
                             eps=v.get("layer_norm_eps", 1e-6), scale_factor=config.get("scale_factor", 2),
                             text_hidden=text["hidden_size"])


def random_idefics_vision_weights(spec: IdeficsVisionSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    def normal(*dims: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(dims) * scale).astype(np.float32)

    e, p = spec.hidden, "model.vision_model."
    w = {p + "embeddings.patch_embedding.weight": normal(e, spec.channels, spec.patch, spec.patch, scale=0.1),
         p + "embeddings.patch_embedding.bias": normal(e, scale=0.1),
         p + "embeddings.position_embedding.weight": normal(spec.side ** 2, e, scale=0.2),
         p + "post_layernorm.weight": 1 + normal(e, scale=0.1), p + "post_layernorm.bias": normal(e, scale=0.1),
         "model.connector.modality_projection.proj.weight": normal(spec.text_hidden, e * spec.scale_factor ** 2,
                                                                   scale=0.05)}
    for n in range(spec.layers):
        q = f"{p}encoder.layers.{n}."
        for norm in ("layer_norm1", "layer_norm2"):
            w[q + norm + ".weight"], w[q + norm + ".bias"] = 1 + normal(e, scale=0.1), normal(e, scale=0.1)
        shapes = {"self_attn.q_proj": (e, e), "self_attn.k_proj": (e, e), "self_attn.v_proj": (e, e),
                  "self_attn.out_proj": (e, e), "mlp.fc1": (spec.intermediate, e), "mlp.fc2": (e, spec.intermediate)}
        for name, (rows, cols) in shapes.items():
            w[q + name + ".weight"], w[q + name + ".bias"] = normal(rows, cols, scale=0.2), normal(rows, scale=0.1)
    return w


class _IdeficsVision(VisionGraph):
    def __init__(self, spec: IdeficsVisionSpec, weights: dict[str, np.ndarray], fused: bool = False) -> None:
        super().__init__(weights, fused)
        self.s = spec

    def real_tiles(self) -> tuple[str, str]:
        """[tiles, 3, H, W] pixels and [tiles, H, W] mask without the all-zero (padding) tiles."""
        g, s = self.g, self.s
        pixels = g.op("Reshape", ["pixel_values", self.ints(-1, s.channels, s.image_size, s.image_size)])
        mask = g.op("Reshape", ["pixel_attention_mask", self.ints(-1, s.image_size, s.image_size)])
        nonzero = g.op("Cast", [g.op("Not", [g.op("Equal", [pixels, self.const("zero", np.float32(0.0))])])],
                       to=TensorProto.INT64)
        real = g.op("Greater", [g.op("ReduceSum", [nonzero, self.ints(1, 2, 3)], keepdims=0),
                                self.const("zero", np.int64(0))])
        # keep the first tile when none is real (transformers leaves one "empty image")
        count = g.op("Gather", [g.op("Shape", [real]), self.const("zero", np.int64(0))])
        first = g.op("Equal", [g.op("Range", [self.const("zero", np.int64(0)), count, self.const("one", np.int64(1))]),
                               self.const("zero", np.int64(0))])
        none = g.op("Not", [g.op("Cast", [g.op("ReduceMax", [g.op("Cast", [real], to=TensorProto.INT32)],
                                               keepdims=0)], to=TensorProto.BOOL)])
        keep = g.op("Or", [real, g.op("And", [first, none])])
        return g.op("Compress", [pixels, keep], axis=0), g.op("Compress", [mask, keep], axis=0)

    def position_ids(self, patch_mask: str) -> str:
        """[tiles, side²] learned-position indices, as transformers' bucketized fractional coordinates."""
        g, s = self.g, self.s
        as_int = g.op("Cast", [patch_mask], to=TensorProto.INT64)  # [tiles, side, side]
        rows = g.op("ReduceSum", [g.op("Gather", [as_int, self.const("col0", np.int64(0))], axis=2), self.ints(1)],
                    keepdims=1)  # valid patch rows per tile [tiles, 1]
        cols = g.op("ReduceSum", [g.op("Gather", [as_int, self.const("row0", np.int64(0))], axis=1), self.ints(1)],
                    keepdims=1)
        index = self.const("index", s.side * np.arange(s.side, dtype=np.int64)[None, :] - 1)
        one, zero = self.const("one", np.int64(1)), self.const("zero", np.int64(0))

        def bucket(valid: str) -> str:
            # transformers: bucketize(i / valid * (1 - 1e-6), arange(1/side, 1, 1/side), right=True); the
            # shrink makes exact hits fall one bucket lower, which in integers is max((side*i - 1) // valid, 0)
            # (equal for every size, checked in the tests; and fp16-proof, where 1 - 1e-6 rounds to 1)
            return g.op("Max", [g.op("Div", [index, g.op("Max", [valid, one])]), zero])

        ids = g.op("Add", [g.op("Mul", [g.op("Unsqueeze", [bucket(rows), self.ints(2)]),
                                        self.const("side", np.int64(s.side))]),
                           g.op("Unsqueeze", [bucket(cols), self.ints(1)])])  # [tiles, side, side]
        ids = g.op("Where", [patch_mask, ids, self.const("zero", np.int64(0))])
        return g.op("Reshape", [ids, self.ints(0, -1)])

    def layer(self, x: str, n: int, bias: str) -> str:
        g, s = self.g, self.s
        d, p = s.hidden // s.heads, f"model.vision_model.encoder.layers.{n}."
        h = self.layer_norm(x, p + "layer_norm1", s.eps)
        if self.fused:  # q, k, v stay [tiles, patches, hidden]; ``bias`` is the [tiles, patches] int32 key mask
            q, k, v = (self.linear(h, p + f"self_attn.{kind}_proj") for kind in ("q", "k", "v"))
            out = self.if_(self.all_valid, lambda: self.mha(q, k, v, s.heads),
                           lambda: self.mha(q, k, v, s.heads, key_mask=bias))
        else:
            heads = [g.op("Transpose", [g.op("Reshape", [self.linear(h, p + f"self_attn.{kind}_proj"),
                                                         self.ints(0, 0, s.heads, d)])], perm=[0, 2, 1, 3])
                     for kind in ("q", "k", "v")]
            out = self.attention(*heads, bias, d)
            out = g.op("Reshape", [g.op("Transpose", [out], perm=[0, 2, 1, 3]), self.ints(0, 0, s.hidden)])
        x = g.op("Add", [x, self.linear(out, p + "self_attn.out_proj")])
        h = self.layer_norm(x, p + "layer_norm2", s.eps)
        return g.op("Add", [x, self.linear(self.act(self.linear(h, p + "mlp.fc1"), s.act), p + "mlp.fc2")])

    def build(self) -> onnx.ModelProto:
        g, s = self.g, self.s
        pixels, mask = self.real_tiles()
        p = "model.vision_model.embeddings."
        pooled = g.op("MaxPool", [g.op("Unsqueeze", [g.op("Cast", [mask], to=TensorProto.FLOAT), self.ints(1)])],
                      kernel_shape=[s.patch, s.patch], strides=[s.patch, s.patch])
        patch_mask = g.op("Greater", [g.op("Squeeze", [pooled, self.ints(1)]), self.const("zero", np.float32(0))])
        x = g.op("Conv", [pixels, self.const("patch_w", self.w[p + "patch_embedding.weight"]),
                          self.const("patch_b", self.w[p + "patch_embedding.bias"])],
                 kernel_shape=[s.patch, s.patch], strides=[s.patch, s.patch])
        x = g.op("Transpose", [g.op("Reshape", [x, self.ints(0, s.hidden, -1)])], perm=[0, 2, 1])  # [tiles, P, E]
        table = self.const("positions", self.w[p + "position_embedding.weight"])
        x = g.op("Add", [x, g.op("Gather", [table, self.position_ids(patch_mask)])])
        if self.fused:  # padded patches masked as keys (when there are any: else no mask at all)
            bias = g.op("Cast", [g.op("Reshape", [patch_mask, self.ints(0, -1)])], to=TensorProto.INT32)
            self.all_valid = g.op("Cast", [g.op("ReduceMin", [bias], keepdims=0)], to=TensorProto.BOOL)
        else:
            bias = self.bias(g.op("Reshape", [patch_mask, self.ints(0, 1, 1, -1)]))  # padded patches masked as keys
        for n in range(s.layers):
            x = self.layer(x, n, bias)
        x = self.layer_norm(x, "model.vision_model.post_layernorm", s.eps)
        # pixel shuffle: (side, side/f, E*f) -> swap -> (side/f, side/f, E*f*f) -> swap -> (side²/f², E*f²)
        f, side, e = s.scale_factor, s.side, s.hidden
        x = g.op("Transpose", [g.op("Reshape", [x, self.ints(-1, side, side // f, e * f)])], perm=[0, 2, 1, 3])
        x = g.op("Transpose", [g.op("Reshape", [x, self.ints(-1, side // f, side // f, e * f * f)])], perm=[0, 2, 1, 3])
        x = g.op("Reshape", [x, self.ints(-1, s.image_seq_len, e * f * f)])
        self.linear(x, "model.connector.modality_projection.proj")
        g.nodes[-1].output[0] = "image_features"
        inputs = [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT,
                                                ["batch_size", "num_images", s.channels, "height", "width"]),
                  helper.make_tensor_value_info("pixel_attention_mask", TensorProto.BOOL,
                                                ["batch_size", "num_images", "height", "width"])]
        out = helper.make_tensor_value_info("image_features", TensorProto.FLOAT,
                                            ["num_real_images", s.image_seq_len, s.text_hidden])
        return self.finish("idefics3_vision_encoder", inputs, [out])


def build_idefics3_vision(spec: IdeficsVisionSpec, weights: dict[str, np.ndarray],
                          fused: bool = False) -> onnx.ModelProto:
    """The Idefics3/SmolVLM ``vision_encoder`` graph (see the module docstring; ``fused``: ORT's attention op)."""
    return _IdeficsVision(spec, weights, fused).build()
