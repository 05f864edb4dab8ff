"""The GLM-4.1V (``glm4v``) vision tower written with ``onnx.helper`` (no torch), from Hugging Face weights.

Qwen2-VL's tower (``edge_runtime.vision_graphs``: the same patch order, 2-D rotary and per-frame
attention) with GLM's differences, as transformers' ``Glm4vVisionModel``:

* the patch embedding (a Conv3d whose kernel equals its stride: a MatMul) has a bias and is
  followed by an RMSNorm (``post_conv_layernorm``);
* a learned position table of ``(image_size / patch)²`` entries, resampled to each image's
  grid with bicubic interpolation (``GridSample``: border padding, ``align_corners`` off, the
  sample point of patch (row, col) at ``((col + 0.5) / w, (row + 0.5) / h)`` scaled to [-1, 1],
  as transformers' ``F.grid_sample``), added to every patch;
* blocks of RMSNorm, attention (qkv bias per ``attention_bias``, no projection bias) and a
  bias-free SwiGLU MLP whose width is ``out_hidden_size``;
* after the blocks an RMSNorm, then the 2x2 merge as a strided Conv2d (``downsample``: over
  the 4 consecutive rows of a merge block, a MatMul with its kernel in (row, column, channel)
  order), then the merger: a linear layer, LayerNorm, exact GELU and a SwiGLU of width
  ``intermediate_size``.

Inputs ``pixel_values`` [patches, 3*2*14*14] and ``image_grid_thw`` [images, 3]; output
``image_features`` [patches / 4, out_hidden_size]. ``fused=True`` as Qwen2-VL's: ONNX
Runtime's ``MultiHeadAttention``, flash attention when the call holds one frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto

from edge_runtime.vision_graphs import QwenVisionSpec, _QwenVision


@dataclass(frozen=True)
class GlmVisionSpec(QwenVisionSpec):
    act: str = "silu"
    merger_hidden: int = 128     # intermediate_size: the merger's SwiGLU width
    image_size: int = 112        # the position table covers (image_size / patch)² positions
    eps: float = 1e-5            # rms_norm_eps
    qkv_bias: bool = False       # attention_bias

    @property
    def table_side(self) -> int:
        return self.image_size // self.patch

    def config(self) -> dict:
        return {"model_type": "glm4v", "depth": self.depth, "hidden_size": self.embed_dim,
                "out_hidden_size": self.out_hidden, "intermediate_size": self.merger_hidden, "hidden_act": self.act,
                "num_heads": self.heads, "in_channels": self.channels, "patch_size": self.patch,
                "spatial_merge_size": self.merge, "temporal_patch_size": self.temporal,
                "image_size": self.image_size, "rms_norm_eps": self.eps, "attention_bias": self.qkv_bias}


def glm_vision_spec(config: dict) -> GlmVisionSpec:
    """The spec from a ``Glm4vForConditionalGeneration`` config's ``vision_config``; ValueError for what
    the graph does not build."""
    v = config["vision_config"]
    image_size = v.get("image_size", 336)
    if isinstance(image_size, (list, tuple)):
        if len(set(image_size)) != 1:
            raise ValueError(f"vision_config.image_size {image_size}: only a square position table is built")
        image_size = image_size[0]
    spec = GlmVisionSpec(depth=v["depth"], embed_dim=v["hidden_size"], heads=v["num_heads"],
                         mlp_hidden=v["out_hidden_size"], out_hidden=v["out_hidden_size"],
                         patch=v.get("patch_size", 14), temporal=v.get("temporal_patch_size", 2),
                         merge=v.get("spatial_merge_size", 2), channels=v.get("in_channels", 3),
                         act=v.get("hidden_act", "silu"), merger_hidden=v["intermediate_size"],
                         image_size=int(image_size), eps=float(v.get("rms_norm_eps", 1e-5)),
                         qkv_bias=bool(v.get("attention_bias", False)))
    if spec.embed_dim % spec.heads or spec.head_dim % 4:
        raise ValueError(f"vision hidden_size {spec.embed_dim} / num_heads {spec.heads}: the 2-D rotary needs a "
                         "head size that is a multiple of 4")
    return spec


class _GlmVision(_QwenVision):
    s: GlmVisionSpec

    def norm(self, x: str, name: str) -> str:
        return self.rms_norm(x, name, self.s.eps)

    def mlp(self, x: str, prefix: str, width: str = "mlp.") -> str:
        """SwiGLU: down(act(gate(x)) * up(x)); no biases in GLM's checkpoints (``linear`` adds any present)."""
        gate = self.act(self.linear(x, prefix + width + "gate_proj"), self.s.act)
        return self.linear(self.g.op("Mul", [gate, self.linear(x, prefix + width + "up_proj")]),
                           prefix + width + "down_proj")

    def position_table(self) -> str:
        """[patches, embed]: the learned table resampled at each patch's place in its image (bicubic)."""
        g = self.g
        half, two, one = (self.const(n, np.float32(v)) for n, v in (("half", 0.5), ("two", 2.0), ("onef", 1.0)))

        def scaled(index: str, sides: str) -> str:  # ((index + 0.5) / side) * 2 - 1, in float32
            index, sides = (g.op("Cast", [v], to=TensorProto.FLOAT) for v in (index, sides))
            return g.op("Sub", [g.op("Mul", [g.op("Div", [g.op("Add", [index, half]), sides]), two]), one])

        return self.resampled_table("visual.embeddings.position_embedding.weight", scaled, "bicubic", 0)

    def build(self) -> onnx.ModelProto:
        g, s = self.g, self.s
        kernel = self.w["visual.patch_embed.proj.weight"].reshape(s.embed_dim, -1)
        x = g.op("MatMul", ["pixel_values", self.const("patch_embed", np.ascontiguousarray(kernel.T))])
        x = g.op("Add", [x, self.const("patch_embed.bias", self.w["visual.patch_embed.proj.bias"])])
        x = self.norm(x, "visual.post_conv_layernorm")
        cos, sin = self.positions()  # before the table: it reads the rows and columns positions() finds
        x = self.blocks(g.op("Add", [x, self.position_table()]), cos, sin)
        x = self.norm(x, "visual.post_layernorm")
        # downsample: Conv2d(kernel = stride = merge) over each merge block's rows, in (row, column, channel) order
        conv = self.w["visual.downsample.weight"]  # [out, embed, merge, merge]
        x = g.op("Reshape", [x, self.ints(-1, s.embed_dim * s.merge * s.merge)])
        kernel = conv.transpose(0, 2, 3, 1).reshape(conv.shape[0], -1)
        x = g.op("Add", [g.op("MatMul", [x, self.const("downsample", np.ascontiguousarray(kernel.T))]),
                         self.const("downsample.bias", self.w["visual.downsample.bias"])])
        x = self.linear(x, "visual.merger.proj")
        x = self.act(self.g.op("LayerNormalization", [
            x, self.const("merger.norm", self.w["visual.merger.post_projection_norm.weight"]),
            self.const("merger.norm.bias", self.w["visual.merger.post_projection_norm.bias"])], axis=-1, epsilon=1e-5),
            "gelu")
        self.mlp(x, "visual.merger.", width="")
        return self.finish_encoder()


def build_glm4v_vision(spec: GlmVisionSpec, weights: dict[str, np.ndarray], fused: bool = False) -> onnx.ModelProto:
    """The GLM-4.1V ``vision_encoder`` graph (see the module docstring; ``fused``: ORT's attention op)."""
    return _GlmVision(spec, weights, "image_grid_thw", fused).build()
