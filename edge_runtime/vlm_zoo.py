"""Tiny vision-language model folders with random weights, in the transformers.js layout, without torch.

``write_vlm_folder(folder, family, shape, seed)`` writes a complete folder:
``config.json`` (as transformers writes it for the ``*ForConditionalGeneration`` class,
plus the flat text fields transformers.js reads), ``generation_config.json``,
``preprocessor_config.json``, tokenizer files with the family's special tokens and chat
template, and ``onnx/{vision_encoder,embed_tokens,decoder_model_merged}.onnx``. The
weights are drawn from ``seed`` under the names a transformers checkpoint uses
(``random_vlm_weights``), so a test can load them into transformers and compare.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.decoder_zoo import DecoderShape
from edge_runtime.generation.vision.families import FAMILIES as KNOWN
from edge_runtime.decoder_zoo import random_weights as decoder_weights
from edge_runtime.vision_graphs import QwenVisionSpec

FAMILIES = tuple(KNOWN)  # every family generation.vision.families knows
ARCHITECTURES = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
                 "idefics3": "Idefics3ForConditionalGeneration", "smolvlm": "SmolVLMForConditionalGeneration",
                 "glm4v": "Glm4vForConditionalGeneration", "qwen3_vl": "Qwen3VLForConditionalGeneration"}
GLM_ROTARY_FACTOR = 0.5  # GLM-4.1V's partial_rotary_factor: half of each head's channels rotate


@dataclass(frozen=True)
class VLMShape:
    """Sizes of a tiny VLM. ``vision`` None = the family's default tower; pixel budgets are the
    preprocessor's defaults (``min_pixels``/``max_pixels`` for Qwen: at most 64 image tokens here)."""

    text: DecoderShape = DecoderShape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512,
                                      max_positions=4096, rope_theta=1000000.0)
    vision: Any = None
    mrope_section: tuple[int, ...] = (2, 3, 3)
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 64
    extra: dict = field(default_factory=dict, compare=False)  # family-specific processor settings


def vision_spec(family: str, shape: VLMShape) -> Any:
    if shape.vision is not None:
        return shape.vision
    if family == "qwen2_vl":
        return QwenVisionSpec(out_hidden=shape.text.hidden)
    if family == "qwen2_5_vl":
        from edge_runtime.vision_graphs_qwen25 import Qwen25VisionSpec

        return Qwen25VisionSpec(out_hidden=shape.text.hidden)
    if family == "glm4v":
        from edge_runtime.vision_graphs_glm4v import GlmVisionSpec

        hidden = shape.text.hidden
        return GlmVisionSpec(out_hidden=hidden, mlp_hidden=hidden, merger_hidden=2 * hidden)
    if family == "qwen3_vl":  # a 4x4 position table, DeepStack sets from both blocks
        from edge_runtime.vision_graphs_qwen3vl import Qwen3VisionSpec

        return Qwen3VisionSpec(out_hidden=shape.text.hidden, mlp_hidden=64, positions=16, deepstack=(0, 1))
    from edge_runtime.vision_graphs_idefics import IdeficsVisionSpec

    return IdeficsVisionSpec(text_hidden=shape.text.hidden)


def _normal(rng: np.random.Generator, *dims: int, scale: float) -> np.ndarray:
    return (rng.standard_normal(dims) * scale).astype(np.float32)


def _qwen_vision_weights(spec: QwenVisionSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    e, m = spec.embed_dim, spec.embed_dim * spec.merge ** 2
    w = {"visual.patch_embed.proj.weight": _normal(rng, e, spec.channels, spec.temporal, spec.patch, spec.patch,
                                                   scale=0.05),
         "visual.merger.ln_q.weight": 1 + _normal(rng, e, scale=0.1),
         "visual.merger.ln_q.bias": _normal(rng, e, scale=0.1),
         "visual.merger.mlp.0.weight": _normal(rng, m, m, scale=0.1),
         "visual.merger.mlp.0.bias": _normal(rng, m, scale=0.1),
         "visual.merger.mlp.2.weight": _normal(rng, spec.out_hidden, m, scale=0.05),
         "visual.merger.mlp.2.bias": _normal(rng, spec.out_hidden, scale=0.05)}
    for n in range(spec.depth):
        p = f"visual.blocks.{n}."
        for norm in ("norm1", "norm2"):
            w[p + norm + ".weight"], w[p + norm + ".bias"] = 1 + _normal(rng, e, scale=0.1), _normal(rng, e, scale=0.1)
        for name, (rows, cols) in {"attn.qkv": (3 * e, e), "attn.proj": (e, e), "mlp.fc1": (spec.mlp_hidden, e),
                                   "mlp.fc2": (e, spec.mlp_hidden)}.items():
            w[p + name + ".weight"] = _normal(rng, rows, cols, scale=0.2)
            w[p + name + ".bias"] = _normal(rng, rows, scale=0.1)
    return w


def _glm_vision_weights(spec: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    e, o, side = spec.embed_dim, spec.out_hidden, spec.table_side
    w = {"visual.patch_embed.proj.weight": _normal(rng, e, spec.channels, spec.temporal, spec.patch, spec.patch,
                                                   scale=0.05),
         "visual.patch_embed.proj.bias": _normal(rng, e, scale=0.1),
         "visual.post_conv_layernorm.weight": 1 + _normal(rng, e, scale=0.1),
         "visual.embeddings.position_embedding.weight": _normal(rng, side * side, e, scale=0.2),
         "visual.post_layernorm.weight": 1 + _normal(rng, e, scale=0.1),
         "visual.downsample.weight": _normal(rng, o, e, spec.merge, spec.merge, scale=0.1),
         "visual.downsample.bias": _normal(rng, o, scale=0.1),
         "visual.merger.proj.weight": _normal(rng, o, o, scale=0.2),
         "visual.merger.post_projection_norm.weight": 1 + _normal(rng, o, scale=0.1),
         "visual.merger.post_projection_norm.bias": _normal(rng, o, scale=0.1),
         "visual.merger.gate_proj.weight": _normal(rng, spec.merger_hidden, o, scale=0.2),
         "visual.merger.up_proj.weight": _normal(rng, spec.merger_hidden, o, scale=0.2),
         "visual.merger.down_proj.weight": _normal(rng, o, spec.merger_hidden, scale=0.1)}
    for n in range(spec.depth):
        p = f"visual.blocks.{n}."
        w[p + "norm1.weight"], w[p + "norm2.weight"] = 1 + _normal(rng, e, scale=0.1), 1 + _normal(rng, e, scale=0.1)
        for name, (rows, cols) in {"attn.qkv": (3 * e, e), "attn.proj": (e, e), "mlp.gate_proj": (spec.mlp_hidden, e),
                                   "mlp.up_proj": (spec.mlp_hidden, e), "mlp.down_proj": (e, spec.mlp_hidden)}.items():
            w[p + name + ".weight"] = _normal(rng, rows, cols, scale=0.2)
    return {"model." + name: value for name, value in w.items()}  # as GLM-4.1V checkpoints name them


def _glm_text_weights(text: dict[str, np.ndarray], shape: DecoderShape,
                      rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Qwen2-named decoder weights as a GLM-4.1V checkpoint names them: under ``model.language_model.``, gate and
    up fused into ``gate_up_proj``, the two post-norms of each layer, an untied head."""
    out = {"lm_head.weight": _normal(rng, shape.vocab, shape.hidden, scale=0.2)}
    for name, value in text.items():
        if name.endswith("mlp.up_proj.weight"):
            continue
        new = "model.language_model." + name[len("model."):]
        if name.endswith("mlp.gate_proj.weight"):
            new, value = new.replace("gate_proj", "gate_up_proj"), np.concatenate(
                [value, text[name.replace("gate_proj", "up_proj")]])
        out[new] = value
    for n in range(shape.layers):
        for norm in ("post_self_attn_layernorm", "post_mlp_layernorm"):
            out[f"model.language_model.layers.{n}.{norm}.weight"] = 1 + _normal(rng, shape.hidden, scale=0.2)
    return out


def _qwen3_vision_weights(spec: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    e, m, o = spec.embed_dim, spec.embed_dim * spec.merge ** 2, spec.out_hidden
    w = {"visual.patch_embed.proj.weight": _normal(rng, e, spec.channels, spec.temporal, spec.patch, spec.patch,
                                                   scale=0.05),
         "visual.patch_embed.proj.bias": _normal(rng, e, scale=0.1),
         "visual.pos_embed.weight": _normal(rng, spec.positions, e, scale=0.2)}
    mergers = [("visual.merger.", e)] + [(f"visual.deepstack_merger_list.{i}.", m) for i in range(len(spec.deepstack))]
    for prefix, norm in mergers:
        w.update({prefix + "norm.weight": 1 + _normal(rng, norm, scale=0.1),
                  prefix + "norm.bias": _normal(rng, norm, scale=0.1),
                  prefix + "linear_fc1.weight": _normal(rng, m, m, scale=0.1),
                  prefix + "linear_fc1.bias": _normal(rng, m, scale=0.1),
                  prefix + "linear_fc2.weight": _normal(rng, o, m, scale=0.05),
                  prefix + "linear_fc2.bias": _normal(rng, o, scale=0.05)})
    for n in range(spec.depth):
        p = f"visual.blocks.{n}."
        for norm in ("norm1", "norm2"):
            w[p + norm + ".weight"], w[p + norm + ".bias"] = 1 + _normal(rng, e, scale=0.1), _normal(rng, e, scale=0.1)
        for name, (rows, cols) in {"attn.qkv": (3 * e, e), "attn.proj": (e, e),
                                   "mlp.linear_fc1": (spec.mlp_hidden, e),
                                   "mlp.linear_fc2": (e, spec.mlp_hidden)}.items():
            w[p + name + ".weight"] = _normal(rng, rows, cols, scale=0.2)
            w[p + name + ".bias"] = _normal(rng, rows, scale=0.1)
    return {"model." + name: value for name, value in w.items()}  # as Qwen3-VL checkpoints name them


def text_shape(family: str, shape: VLMShape) -> DecoderShape:
    """The decoder's shape: ``shape.text``, with Qwen3-VL's q/k norms, interleaved M-RoPE and DeepStack sets."""
    if family != "qwen3_vl":
        return shape.text
    sets = len(vision_spec(family, shape).deepstack)
    return replace(shape.text, qk_norm=True, mrope_interleaved=True, deepstack=sets)


def glm_mrope_section(rotated_half: int) -> tuple[int, int, int]:
    """GLM-4.1V's split of the rotated frequencies over (t, h, w): [8, 12, 12] of 32, in proportion."""
    h = 3 * rotated_half // 8
    return rotated_half - 2 * h, h, h


def random_vlm_weights(family: str, shape: VLMShape, seed: int = 0) -> dict[str, np.ndarray]:
    """Checkpoint-named random weights (Qwen: ``visual.*``, ``model.*``; Idefics3: ``model.text_model.*``...)."""
    rng = np.random.default_rng(seed + 1000)
    spec = vision_spec(family, shape)
    text = decoder_weights(text_shape(family, shape), seed)
    if family == "qwen3_vl":  # Qwen3's text model: no q/k/v biases, under model.language_model., tied head
        text = {"model.language_model." + k[len("model."):]: v for k, v in text.items() if not k.endswith("_proj.bias")}
        return {**text, **_qwen3_vision_weights(spec, rng)}
    if family == "glm4v":
        return {**_glm_text_weights(text, shape.text, rng), **_glm_vision_weights(spec, rng)}
    if family == "qwen2_vl":
        return {**text, **_qwen_vision_weights(spec, rng)}
    if family == "qwen2_5_vl":
        from edge_runtime.vision_graphs_qwen25 import random_qwen25_vision_weights

        return {**text, **random_qwen25_vision_weights(spec, rng)}
    from edge_runtime.vision_graphs_idefics import random_idefics_vision_weights

    # Llama-style text model: no q/k/v biases, its own head
    text = {"model.text_model." + k[len("model."):]: v for k, v in text.items() if not k.endswith("_proj.bias")}
    text["lm_head.weight"] = _normal(rng, shape.text.vocab, shape.text.hidden, scale=0.2)
    return {**text, **random_idefics_vision_weights(spec, rng)}


def _text_fields(shape: DecoderShape) -> dict[str, Any]:
    return {"vocab_size": shape.vocab, "hidden_size": shape.hidden, "intermediate_size": shape.intermediate,
            "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads, "max_position_embeddings": shape.max_positions,
            "rope_theta": shape.rope_theta, "rms_norm_eps": shape.rms_eps, "hidden_act": "silu"}


def vlm_config(family: str, shape: VLMShape, ids: dict[str, int]) -> dict[str, Any]:
    """config.json of the ``*ForConditionalGeneration`` model (transformers 4.57's nesting, plus the
    text fields repeated at the top level: transformers.js reads Qwen2-VL's KV sizes from there)."""
    spec = vision_spec(family, shape)
    text = _text_fields(shape.text)
    if family in ("qwen2_vl", "qwen2_5_vl"):
        text.update(model_type=f"{family}_text", tie_word_embeddings=True, bos_token_id=ids["<|endoftext|>"],
                    eos_token_id=ids["<|im_end|>"],
                    rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": list(shape.mrope_section)})
        config = {**text, "text_config": dict(text), "vision_config": spec.config(),
                  "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
                  "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"]}
    elif family == "qwen3_vl":
        text.update(model_type="qwen3_vl_text", tie_word_embeddings=True, head_dim=shape.text.head_dim,
                    attention_bias=False, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                    rope_scaling={"rope_type": "default", "mrope_interleaved": True,
                                  "mrope_section": list(shape.mrope_section)})
        config = {"text_config": text, "vision_config": spec.config(), "image_token_id": ids["<|image_pad|>"],
                  "video_token_id": ids["<|video_pad|>"], "vision_start_token_id": ids["<|vision_start|>"],
                  "vision_end_token_id": ids["<|vision_end|>"], "tie_word_embeddings": True}
    elif family == "glm4v":
        rotated_half = int(shape.text.head_dim * GLM_ROTARY_FACTOR) // 2
        text.update(model_type="glm4v_text", tie_word_embeddings=False, partial_rotary_factor=GLM_ROTARY_FACTOR,
                    eos_token_id=[ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]],
                    pad_token_id=ids["<|endoftext|>"],
                    rope_scaling={"rope_type": "default", "mrope_section": list(glm_mrope_section(rotated_half))})
        config = {"text_config": text, "vision_config": spec.config(), "image_token_id": ids["<|image|>"],
                  "video_token_id": ids["<|video|>"], "image_start_token_id": ids["<|begin_of_image|>"],
                  "image_end_token_id": ids["<|end_of_image|>"], "video_start_token_id": ids["<|begin_of_video|>"],
                  "video_end_token_id": ids["<|end_of_video|>"], "tie_word_embeddings": False}
    else:
        text.update(model_type="llama", tie_word_embeddings=False, bos_token_id=ids["<|im_start|>"],
                    eos_token_id=ids["<end_of_utterance>"], pad_token_id=ids["<|im_end|>"])
        vision = {**spec.config(), "model_type": f"{family}_vision"}
        config = {"text_config": text, "vision_config": vision, "image_token_id": ids["<image>"],
                  "scale_factor": spec.scale_factor, "tie_word_embeddings": False,
                  "pad_token_id": ids["<|im_end|>"]}
    config.update(model_type=family, architectures=[ARCHITECTURES[family]], torch_dtype="float32")
    return config


def write_vlm_folder(folder: Path, family: str = "qwen2_vl", shape: VLMShape | None = None, seed: int = 0,
                     fp16: bool = False, fused: bool = False, fused_decoder: bool = True) -> Path:
    """A complete transformers.js-layout folder (see the module docstring); returns ``folder``.
    ``fused``: the vision encoder's attention as ONNX Runtime's fused op; ``fused_decoder``: the decoder
    as GroupQueryAttention (``vlm_parts.iter_vlm_parts``)."""
    from edge_runtime.vlm_files import (glm_preprocessor_config, idefics_preprocessor_config, qwen_preprocessor_config,
                                        write_vlm_text_files)
    from edge_runtime.vlm_parts import iter_vlm_parts, save_parts

    if family not in FAMILIES:
        raise ValueError(f"unknown VLM family {family!r}: expected one of {list(FAMILIES)}")
    shape = shape or VLMShape()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ids = write_vlm_text_files(folder, family, shape.text.vocab, seed, shape.text.max_positions)
    config = vlm_config(family, shape, ids)
    external = save_parts(folder, iter_vlm_parts(config, random_vlm_weights(family, shape, seed), fused=fused,
                                                  fused_decoder=fused_decoder), fp16)
    config["transformers.js_config"] = {"use_external_data_format": external}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    text = config.get("text_config", config)
    if KNOWN[family].preprocessing == "qwen":
        processor = qwen_preprocessor_config(family, shape.min_pixels, shape.max_pixels,
                                             patch=vision_spec(family, shape).patch)
        eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    elif family == "glm4v":  # GLM's bounds count both temporal frames of a still image
        processor = glm_preprocessor_config(2 * shape.min_pixels, 2 * shape.max_pixels)
        eos = text["eos_token_id"]
    else:
        spec = vision_spec(family, shape)
        processor = idefics_preprocessor_config(family, spec.image_size,
                                                shape.extra.get("longest_edge", 2 * spec.image_size),
                                                shape.extra.get("split", True))
        eos = [ids["<end_of_utterance>"]]
        (folder / "processor_config.json").write_text(json.dumps(
            {"image_seq_len": spec.image_seq_len, "processor_class": processor["processor_class"]}, indent=2))
    (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
    generation = {"bos_token_id": text.get("bos_token_id"), "eos_token_id": eos, "pad_token_id": text.get(
        "pad_token_id", ids.get("<|endoftext|>")), "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return folder
