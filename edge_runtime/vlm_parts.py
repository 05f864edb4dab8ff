"""The three ONNX parts of a VLM (transformers.js layout) from a transformers config and its weights.

``build_vlm_parts(config, weights)`` returns ``{"vision_encoder", "embed_tokens",
"decoder_model_merged"}`` graphs, built with ``onnx.helper`` (no torch): the config
is the ``config.json`` of the ``*ForConditionalGeneration`` model, the weights are
named as its ``model.safetensors`` names them (the legacy ``visual.*`` / ``model.*``
names transformers saves for Qwen2-VL, or the newer ``model.visual.*`` /
``model.language_model.*``; both are accepted). Used by ``vlm_zoo`` (random weights)
and by the converter (a checkpoint's weights), so both write the same graphs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from edge_runtime.decoder_zoo import DecoderShape, build_decoder
from edge_runtime.model_zoo import OPSET

QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl")
IDEFICS_FAMILIES = ("idefics3", "smolvlm")
SUPPORTED_MODEL_TYPES = QWEN_FAMILIES + IDEFICS_FAMILIES


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's fields: ``text_config`` over the top level (older checkpoints keep them flat)."""
    flat = {k: v for k, v in config.items() if k not in ("text_config", "vision_config")}
    return {**flat, **(config.get("text_config") or {})}


def decoder_shape(config: Mapping[str, Any]) -> DecoderShape:
    text = text_config(config)
    heads = text["num_attention_heads"]
    shape = DecoderShape(hidden=text["hidden_size"], layers=text["num_hidden_layers"], heads=heads,
                         kv_heads=text.get("num_key_value_heads") or heads, intermediate=text["intermediate_size"],
                         vocab=text["vocab_size"], max_positions=text.get("max_position_embeddings", 2048),
                         rope_theta=float(text.get("rope_theta", 10000.0)), rms_eps=text.get("rms_norm_eps", 1e-6))
    if text.get("head_dim") not in (None, shape.head_dim):
        raise ValueError(f"text head_dim {text['head_dim']} != hidden_size / num_attention_heads = {shape.head_dim}: "
                         "not supported")
    return shape


def mrope_section(config: Mapping[str, Any]) -> tuple[int, ...]:
    rope = text_config(config).get("rope_scaling") or {}
    if "mrope_section" not in rope:
        raise ValueError(f"{config.get('model_type')}: rope_scaling.mrope_section is missing from the config")
    return tuple(int(n) for n in rope["mrope_section"])


def text_weights(family: str, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The decoder's weights under Qwen2's names (``model.layers.N...``, ``model.norm``, ``lm_head``)."""
    prefixes = (("model.language_model.", "model."),) if family in QWEN_FAMILIES else (("model.text_model.", "model."),)
    out = {}
    for name, value in weights.items():
        for old, new in prefixes:
            if name.startswith(old):
                name = new + name[len(old):]
                break
        if name.startswith("model.") and not name.startswith(("model.visual.", "model.vision_model.",
                                                             "model.connector.")) or name == "lm_head.weight":
            out[name] = value
    return out


def vision_weights(family: str, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The vision tower's weights: ``visual.*`` (Qwen) or ``model.vision_model.*`` + ``model.connector.*``."""
    if family in QWEN_FAMILIES:
        return {("visual." + k[len("model.visual."):] if k.startswith("model.visual.") else k): v
                for k, v in weights.items() if k.startswith(("visual.", "model.visual."))}
    return {k: v for k, v in weights.items() if k.startswith(("model.vision_model.", "model.connector."))}


def build_embed_tokens(table: np.ndarray) -> onnx.ModelProto:
    """``input_ids`` [batch, seq] -> ``inputs_embeds`` [batch, seq, hidden]: one Gather."""
    table = np.asarray(table, np.float32)
    node = helper.make_node("Gather", ["embed_tokens.weight", "input_ids"], ["inputs_embeds"], name="embed")
    graph = helper.make_graph(
        [node], "embed_tokens",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])],
        [helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT,
                                       ["batch_size", "sequence_length", table.shape[1]])],
        [onnx.numpy_helper.from_array(table, "embed_tokens.weight")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="edge-runtime")
    model.ir_version = 8
    return model


def build_vlm_parts(config: Mapping[str, Any], weights: Mapping[str, np.ndarray]) -> dict[str, onnx.ModelProto]:
    """The three graphs for ``config["model_type"]`` (one of ``SUPPORTED_MODEL_TYPES``)."""
    family = config.get("model_type")
    if family not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {family!r} is not supported: expected one of {list(SUPPORTED_MODEL_TYPES)}")
    weights = {k: np.asarray(v, np.float32) for k, v in weights.items()}
    text = text_weights(family, weights)
    if text_config(config).get("tie_word_embeddings") and "lm_head.weight" in text:
        del text["lm_head.weight"]  # the decoder ties to the embedding table when no head is given
    shape = decoder_shape(config)
    if family in QWEN_FAMILIES:
        decoder = build_decoder(shape, text, inputs_embeds=True, mrope_section=mrope_section(config))
    else:
        decoder = build_decoder(shape, text, inputs_embeds=True)
    vision = vision_weights(family, weights)
    if family == "qwen2_vl":
        from edge_runtime.vision_graphs import build_qwen2_vl_vision, qwen_vision_spec

        encoder = build_qwen2_vl_vision(qwen_vision_spec(config), vision)
    elif family == "qwen2_5_vl":
        from edge_runtime.vision_graphs_qwen25 import build_qwen2_5_vl_vision, qwen25_vision_spec

        encoder = build_qwen2_5_vl_vision(qwen25_vision_spec(config), vision)
    else:
        from edge_runtime.vision_graphs_idefics import build_idefics3_vision, idefics_vision_spec

        encoder = build_idefics3_vision(idefics_vision_spec(config), vision)
    return {"vision_encoder": encoder, "embed_tokens": build_embed_tokens(text["model.embed_tokens.weight"]),
            "decoder_model_merged": decoder}


# decoder_model_merged always keeps its weights in "<file>_data" (as the onnx-community folders do, and so
# that every folder exercises the external-data path); the other parts only above this size.
EXTERNAL_DATA_BYTES = 512 * 2**20


def save_parts(folder: Path, parts: Mapping[str, onnx.ModelProto], fp16: bool = False) -> dict[str, int]:
    """Write ``folder/onnx/<part>.onnx`` (and ``<part>_fp16.onnx`` when ``fp16``); returns the
    ``transformers.js_config.use_external_data_format`` map (file name -> number of data chunks)."""
    onnx_dir = Path(folder) / "onnx"
    onnx_dir.mkdir(parents=True, exist_ok=True)
    external = {}
    for name, model in parts.items():
        variants = [(name, model)]
        if fp16:
            from onnxruntime.transformers.float16 import convert_float_to_float16

            # keep_io_types: the host feeds float32 either way; weights and arithmetic are fp16 inside
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            variants.append((name + "_fp16", convert_float_to_float16(copy, keep_io_types=True,
                                                                      disable_shape_infer=True)))
        for stem, proto in variants:
            path = onnx_dir / f"{stem}.onnx"
            for stale in (path, onnx_dir / f"{stem}.onnx_data"):
                stale.unlink(missing_ok=True)
            if name == "decoder_model_merged" or proto.ByteSize() > EXTERNAL_DATA_BYTES:
                onnx.save(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                          location=f"{stem}.onnx_data", size_threshold=1024)
                (onnx_dir / f"{stem}.onnx_data").chmod(0o644)
                external[path.name] = 1
            else:
                onnx.save(proto, str(path))
    return external
