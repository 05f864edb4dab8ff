"""The Qwen2.5-VL vision tower written with ``onnx.helper`` (no torch), from Hugging Face weights.

Qwen2-VL's tower (``edge_runtime.vision_graphs``) with RMSNorm instead of LayerNorm, a
SwiGLU MLP with biases, an RMSNorm patch merger, and *window attention*: every block not
in ``fullatt_block_indexes`` attends only within windows of ``window_size`` pixels
(``window_size / patch / merge`` merge blocks a side), per frame. transformers reorders
the patches window by window, attends over contiguous windows, and restores the order
after the merger; attention is the same under any order given the same visible sets,
and the merger works on whole merge blocks, so here the patches keep their order and
each windowed block gets a mask "same frame, same window row, same window column".
The fused form (``fused=True``) instead scatters the patches into one row of W slots per
window, attends per window with ONNX Runtime's ``MultiHeadAttention`` (empty slots of
edge windows masked as keys) and gathers them back: windows * W² work, not patches².
Input ``pixel_values`` and ``image_grid_thw`` (transformers.js's name for Qwen2.5-VL).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from edge_runtime.vision_graphs import QwenVisionSpec, _QwenVision


@dataclass(frozen=True)
class Qwen25VisionSpec(QwenVisionSpec):
    act: str = "silu"
    window_size: int = 56                   # pixels; 56 / 14 / 2 = 2 merge blocks a side here
    fullatt_blocks: tuple[int, ...] = (1,)  # fullatt_block_indexes

    @property
    def window_blocks(self) -> int:
        return self.window_size // self.merge // self.patch

    def config(self) -> dict:
        return {"model_type": "qwen2_5_vl", "depth": self.depth, "hidden_size": self.embed_dim,
                "out_hidden_size": self.out_hidden, "intermediate_size": self.mlp_hidden, "hidden_act": self.act,
                "num_heads": self.heads, "in_channels": self.channels, "patch_size": self.patch,
                "spatial_merge_size": self.merge, "temporal_patch_size": self.temporal,
                "window_size": self.window_size, "fullatt_block_indexes": list(self.fullatt_blocks),
                "tokens_per_second": 2}


def qwen25_vision_spec(config: dict) -> Qwen25VisionSpec:
    v = config["vision_config"]
    return Qwen25VisionSpec(depth=v["depth"], embed_dim=v["hidden_size"], heads=v["num_heads"],
                            mlp_hidden=v["intermediate_size"], out_hidden=v["out_hidden_size"],
                            patch=v.get("patch_size", 14), temporal=v.get("temporal_patch_size", 2),
                            merge=v.get("spatial_merge_size", 2), channels=v.get("in_channels", 3),
                            act=v.get("hidden_act", "silu"), window_size=v.get("window_size", 112),
                            fullatt_blocks=tuple(v.get("fullatt_block_indexes", ())))


def random_qwen25_vision_weights(spec: Qwen25VisionSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    def normal(*dims: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(dims) * scale).astype(np.float32)

    e, m = spec.embed_dim, spec.embed_dim * spec.merge ** 2
    w = {"visual.patch_embed.proj.weight": normal(e, spec.channels, spec.temporal, spec.patch, spec.patch,
                                                  scale=0.05),
         "visual.merger.ln_q.weight": 1 + normal(e, scale=0.1),
         "visual.merger.mlp.0.weight": normal(m, m, scale=0.1), "visual.merger.mlp.0.bias": normal(m, scale=0.1),
         "visual.merger.mlp.2.weight": normal(spec.out_hidden, m, scale=0.05),
         "visual.merger.mlp.2.bias": normal(spec.out_hidden, scale=0.05)}
    for n in range(spec.depth):
        p = f"visual.blocks.{n}."
        w[p + "norm1.weight"], w[p + "norm2.weight"] = 1 + normal(e, scale=0.1), 1 + normal(e, scale=0.1)
        shapes = {"attn.qkv": (3 * e, e), "attn.proj": (e, e), "mlp.gate_proj": (spec.mlp_hidden, e),
                  "mlp.up_proj": (spec.mlp_hidden, e), "mlp.down_proj": (e, spec.mlp_hidden)}
        for name, (rows, cols) in shapes.items():
            w[p + name + ".weight"], w[p + name + ".bias"] = normal(rows, cols, scale=0.2), normal(rows, scale=0.1)
    return w


class _Qwen25Vision(_QwenVision):
    s: Qwen25VisionSpec

    def norm(self, x: str, name: str) -> str:
        return self.rms_norm(x, name, 1e-6)

    def mlp(self, x: str, prefix: str) -> str:
        gate = self.act(self.linear(x, prefix + "mlp.gate_proj"), self.s.act)
        return self.linear(self.g.op("Mul", [gate, self.linear(x, prefix + "mlp.up_proj")]), prefix + "mlp.down_proj")

    def window_bias(self) -> str:
        g, size = self.g, self.const("window", np.int64(self.s.window_blocks))
        allowed = self.same(self.frame)
        for block in (self.block_row, self.block_col):
            allowed = g.op("And", [allowed, self.same(g.op("Div", [block, size]))])
        return self.bias(allowed)

    def block_biases(self) -> list[str | None]:
        if self.fused:  # windowed blocks attend window by window (``windowed``), full ones frame by frame
            self.windows = self.window_slots()
            return [None if n in self.s.fullatt_blocks else "windowed" for n in range(self.s.depth)]
        windowed = self.window_bias()
        return [None if n in self.s.fullatt_blocks else windowed for n in range(self.s.depth)]

    def window_slots(self) -> tuple[str, str, str]:
        """(slot [patches, 1], zeros [windows * W, embed], key mask [windows, W] int32) with W patches a window.

        Every window gets W = (window_blocks * merge)² slots, in transformers' window order (image, frame,
        window row, window column; inside: merge blocks row by row, patches as in a merge block); windows at
        the right and bottom edges are partly empty, their empty slots masked as keys. Attention over
        [windows, W] costs windows * W² instead of patches², what transformers' per-window attention costs.
        """
        g, m, wb = self.g, self.s.merge, self.s.window_blocks
        one, size = self.const("one", np.int64(1)), self.const("wb", np.int64(wb))
        t, h, w = self.grid_cols

        def windows_across(sides: str) -> str:  # ceil(max(sides / merge, 1) / window_blocks)
            blocks = g.op("Max", [g.op("Div", [sides, self.const("m", np.int64(m))]), one])
            return g.op("Div", [g.op("Add", [blocks, self.const("wb1", np.int64(wb - 1))]), size])

        rows, cols = windows_across(h), windows_across(w)  # per image
        per_frame = g.op("Mul", [rows, cols])
        per_image = g.op("Mul", [t, per_frame])
        total = g.op("ReduceSum", [per_image, self.ints(0)], keepdims=1)  # [1]
        first = g.op("Sub", [g.op("CumSum", [per_image, self.const("axis0", np.int64(0))]), per_image])
        image = self.image
        window = g.op("Add", [g.op("Gather", [first, image]),
                              g.op("Mul", [self.frame_in_image, g.op("Gather", [per_frame, image])])])
        window = g.op("Add", [window, g.op("Add", [
            g.op("Mul", [g.op("Div", [self.block_row, size]), g.op("Gather", [cols, image])]),
            g.op("Div", [self.block_col, size])])])
        inside = g.op("Add", [g.op("Mul", [g.op("Mod", [self.block_row, size]), size]),
                              g.op("Mod", [self.block_col, size])])
        mm = self.const("mm", np.int64(m * m))
        inside = g.op("Add", [g.op("Mul", [inside, mm]),
                              g.op("Add", [g.op("Mul", [self.in_row, self.const("m", np.int64(m))]), self.in_col])])
        per_window = (wb * m) ** 2
        slots = g.op("Mul", [total, self.const("w", np.int64(per_window))])
        slot = g.op("Add", [g.op("Mul", [window, self.const("w", np.int64(per_window))]), inside])
        # total on a grid that does not match the patch count (the planner's probes): stay in range
        slot = g.op("Min", [g.op("Max", [slot, self.const("zero", np.int64(0))]), g.op("Sub", [slots, one])])
        slot = g.op("Unsqueeze", [slot, self.ints(1)])
        zeros = g.op("ConstantOfShape", [g.op("Concat", [slots, self.ints(self.s.embed_dim)], axis=0)],
                     value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0]))
        taken = g.op("ScatterND", [g.op("ConstantOfShape", [slots], value=helper.make_tensor(
            "zero", TensorProto.INT32, [1], [0])), slot, g.op("Expand", [self.const("one32", np.ones(1, np.int32)),
                                                                          g.op("Shape", [self.image])])])
        return slot, zeros, g.op("Reshape", [taken, self.ints(-1, per_window)])

    def attend(self, n: int, q: str, k: str, v: str, bias: str | None, frame_bias: str) -> str:
        if bias != "windowed":
            return super().attend(n, q, k, v, bias, frame_bias)
        g, s = self.g, self.s
        slot, zeros, key_mask = self.windows
        per_window = (s.window_blocks * s.merge) ** 2
        # [1, patches, embed] -> [windows, W, embed], attention per window, back to the patches' order
        q, k, v = (g.op("Reshape", [g.op("ScatterND", [zeros, slot, g.op("Reshape", [x, self.ints(-1, s.embed_dim)])]),
                                    self.ints(-1, per_window, s.embed_dim)]) for x in (q, k, v))
        out = self.mha(q, k, v, s.heads, key_mask=key_mask)
        out = g.op("GatherND", [g.op("Reshape", [out, self.ints(-1, s.embed_dim)]), slot])
        return g.op("Unsqueeze", [out, self.ints(0)])


def build_qwen2_5_vl_vision(spec: Qwen25VisionSpec, weights: dict[str, np.ndarray],
                            fused: bool = False) -> onnx.ModelProto:
    """The Qwen2.5-VL ``vision_encoder`` graph (see the module docstring; ``fused``: ORT's attention op)."""
    return _Qwen25Vision(spec, weights, "image_grid_thw", fused).build()
