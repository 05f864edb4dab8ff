"""The Qwen3-VL (``qwen3_vl``) vision tower written with ``onnx.helper`` (no torch), from Hugging Face weights.

Qwen2-VL's tower (``edge_runtime.vision_graphs``: the same merge-block patch order, 2-D rotary
and per-frame attention, fused or portable) with Qwen3-VL's differences, as transformers'
``Qwen3VLVisionModel``:

* 16-px patches; the patch embedding (a Conv3d whose kernel equals its stride: a MatMul) has a bias;
* a learned position table of ``num_position_embeddings`` (a square side² grid) entries, resampled
  to each image's grid bilinearly at ``linspace(0, side - 1, h)`` x ``linspace(0, side - 1, w)``
  (``GridSample``: bilinear, ``align_corners`` on, which puts normalised -1..1 exactly on
  0..side-1), added to every patch;
* blocks of LayerNorm, attention with qkv and projection biases, a GELU (tanh) MLP;
* the merger: LayerNorm per patch, the 2x2 merge, a GELU MLP to the text width; and DeepStack:
  after each block in ``deepstack_visual_indexes`` a merger of its own (its LayerNorm over the
  merged 4 x width) turns that block's output into one more feature set.

Inputs ``pixel_values`` [patches, 3*2*16*16] and ``image_grid_thw`` [images, 3]; output
``image_features`` [patches / 4, out_hidden_size * (1 + deepstack sets)]: the merger's rows, then
each DeepStack set's, side by side along the channels. The decoder (``vlm_parts``) reads the same
widened rows as its ``inputs_embeds`` (``embed_tokens`` pads text rows with zeros), so the layout's
one splice of image rows into the prompt carries the DeepStack sets to their decoder layers:
transformers.js runs it unchanged, where folders that keep only the merger's rows lose them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto

from edge_runtime.vision_graphs import QwenVisionSpec, _QwenVision


@dataclass(frozen=True)
class Qwen3VisionSpec(QwenVisionSpec):
    patch: int = 16
    act: str = "gelu_pytorch_tanh"
    positions: int = 16                  # num_position_embeddings: a square table of side sqrt(positions)
    deepstack: tuple[int, ...] = field(default=(0,))  # deepstack_visual_indexes: blocks feeding a set

    @property
    def table_side(self) -> int:
        return int(round(self.positions ** 0.5))

    def config(self) -> dict:
        return {"model_type": "qwen3_vl", "depth": self.depth, "hidden_size": self.embed_dim,
                "intermediate_size": self.mlp_hidden, "out_hidden_size": self.out_hidden, "hidden_act": self.act,
                "num_heads": self.heads, "in_channels": self.channels, "patch_size": self.patch,
                "spatial_merge_size": self.merge, "temporal_patch_size": self.temporal,
                "num_position_embeddings": self.positions, "deepstack_visual_indexes": list(self.deepstack)}


def qwen3_vision_spec(config: dict) -> Qwen3VisionSpec:
    """The spec from a ``Qwen3VLForConditionalGeneration`` config's ``vision_config``; ValueError for what the
    graph does not build."""
    v = config["vision_config"]
    spec = Qwen3VisionSpec(depth=v["depth"], embed_dim=v["hidden_size"], heads=v["num_heads"],
                           mlp_hidden=v["intermediate_size"], out_hidden=v["out_hidden_size"],
                           patch=v.get("patch_size", 16), temporal=v.get("temporal_patch_size", 2),
                           merge=v.get("spatial_merge_size", 2), channels=v.get("in_channels", 3),
                           act=v.get("hidden_act", "gelu_pytorch_tanh"),
                           positions=int(v.get("num_position_embeddings", 2304)),
                           deepstack=tuple(int(n) for n in v.get("deepstack_visual_indexes", ())))
    if spec.table_side ** 2 != spec.positions:
        raise ValueError(f"vision num_position_embeddings {spec.positions} is not a square grid")
    if spec.embed_dim % spec.heads or spec.head_dim % 4:
        raise ValueError(f"vision hidden_size {spec.embed_dim} / num_heads {spec.heads}: the 2-D rotary needs a "
                         "head size that is a multiple of 4")
    if any(not 0 <= n < spec.depth for n in spec.deepstack) or len(set(spec.deepstack)) != len(spec.deepstack):
        raise ValueError(f"deepstack_visual_indexes {list(spec.deepstack)} must be distinct blocks of "
                         f"0..{spec.depth - 1}")
    return spec


class _Qwen3Vision(_QwenVision):
    s: Qwen3VisionSpec

    def mlp(self, x: str, prefix: str) -> str:
        return self.linear(self.act(self.linear(x, prefix + "mlp.linear_fc1"), self.s.act), prefix + "mlp.linear_fc2")

    def position_table(self) -> str:
        """[patches, embed]: the learned table sampled bilinearly at each patch's place in its image."""
        g = self.g
        two, one = self.const("two", np.float32(2.0)), self.const("onef", np.float32(1.0))

        def scaled(index: str, sides: str) -> str:  # linspace over the table: index / (n - 1) * 2 - 1; n = 1 -> -1
            index = g.op("Cast", [index], to=TensorProto.FLOAT)
            gaps = g.op("Cast", [g.op("Max", [g.op("Sub", [sides, self.const("one", np.int64(1))]),
                                               self.const("one", np.int64(1))])], to=TensorProto.FLOAT)
            return g.op("Sub", [g.op("Mul", [g.op("Div", [index, gaps]), two]), one])

        return self.resampled_table("visual.pos_embed.weight", scaled, "bilinear", 1)

    def merger(self, x: str, prefix: str, postshuffle: bool) -> str:
        """Qwen3VLVisionPatchMerger: LayerNorm (per patch, or over the merged row when ``postshuffle``), the 2x2
        merge, Linear, exact GELU, Linear."""
        s = self.s
        width = s.embed_dim * s.merge * s.merge
        if not postshuffle:
            x = self.norm(x, prefix + "norm")
        x = self.g.op("Reshape", [x, self.ints(-1, width)])
        if postshuffle:
            x = self.norm(x, prefix + "norm")
        return self.linear(self.act(self.linear(x, prefix + "linear_fc1"), "gelu"), prefix + "linear_fc2")

    def build(self) -> onnx.ModelProto:
        g, s = self.g, self.s
        kernel = self.w["visual.patch_embed.proj.weight"].reshape(s.embed_dim, -1)
        x = g.op("MatMul", ["pixel_values", self.const("patch_embed", np.ascontiguousarray(kernel.T))])
        x = g.op("Add", [x, self.const("patch_embed.bias", self.w["visual.patch_embed.proj.bias"])])
        cos, sin = self.positions()  # before the table: it reads the rows and columns positions() finds
        x = g.op("Add", [x, self.position_table()])
        taps = {block: i for i, block in enumerate(s.deepstack)}
        sets: dict[int, str] = {}

        def tap(block: int, out: str) -> None:  # DeepStack: this block's output through a merger of its own
            if block in taps:
                sets[taps[block]] = self.merger(out, f"visual.deepstack_merger_list.{taps[block]}.", postshuffle=True)

        x = self.blocks(x, cos, sin, after=tap)
        main = self.merger(x, "visual.merger.", postshuffle=False)
        if sets:
            g.op("Concat", [main, *(sets[i] for i in range(len(sets)))], axis=-1)
        return self.finish_encoder(width=s.out_hidden * (1 + len(sets)))


def build_qwen3_vl_vision(spec: Qwen3VisionSpec, weights: dict[str, np.ndarray], fused: bool = False
                          ) -> onnx.ModelProto:
    """The Qwen3-VL ``vision_encoder`` graph (see the module docstring; ``fused``: ORT's attention op)."""
    return _Qwen3Vision(spec, weights, "image_grid_thw", fused).build()
