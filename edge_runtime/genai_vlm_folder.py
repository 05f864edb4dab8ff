"""An onnxruntime-genai VLM folder from a Qwen2.5-VL folder in the transformers.js layout (no torch).

``write_genai_vlm_folder(source, out)`` writes what onnxruntime-genai (0.18) loads as a
``qwen2_5_vl`` model (``src/models/multi_modal.cpp``, ``qwen2_5_vl_image_processor.cpp``):

* ``vision.onnx``: the source's ``vision_encoder`` unchanged (``pixel_values`` [patches, 1176],
  ``image_grid_thw`` [images, 3] -> ``image_features`` [tokens, hidden]); genai runs it once
  per image when the grids differ;
* ``embedding.onnx``: the source's ``embed_tokens`` Gather plus the splice genai leaves to
  this graph: ``input_ids`` + ``image_features`` -> ``inputs_embeds`` with the rows at
  ``image_token_id`` overwritten by the feature rows in order (genai feeds a 0-row
  ``image_features`` for text-only prompts and every decode step);
* ``decoder_model_merged.onnx`` (+ its ``_data``): unchanged; genai computes the M-RoPE
  ``position_ids`` [3, batch, seq] itself (``Qwen2VLPositionInputs``);
* ``genai_config.json`` (``model.vision`` / ``model.embedding`` / ``model.decoder``) and
  ``processor_config.json`` (onnxruntime-extensions' image pipeline: smart resize with the
  source's ``min_pixels``/``max_pixels``, rescale, CLIP normalise, 14-px patches, 2x temporal);
* the tokenizer files and ``config.json`` / ``generation_config.json``, copied.

Used by the tests (a real genai VLM folder built locally) and usable to try a converted
checkpoint under onnxruntime-genai.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Mapping

import numpy as np

VISION_FILE, EMBEDDING_FILE, DECODER_FILE = "vision.onnx", "embedding.onnx", "decoder_model_merged.onnx"
PROCESSOR_FILE = "processor_config.json"
_COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
           "config.json", "generation_config.json", "preprocessor_config.json")


def splicing_embedding(embed: Any, image_token_id: int, hidden: int) -> Any:
    """``embed`` (an ``embed_tokens`` graph: ``input_ids`` -> ``inputs_embeds``) grown into genai's
    embedding graph: a second input ``image_features`` [n, hidden] whose rows replace, in order,
    the embeddings of the ``image_token_id`` tokens. Non-image tokens gather a zero row appended
    after the features, so n = 0 (text-only prompts, decode steps) needs no special case."""
    import onnx
    from onnx import TensorProto, helper

    graph = embed.graph
    (out,) = [o for o in graph.output if o.name == "inputs_embeds"]
    for node in graph.node:  # the token rows become an intermediate value
        node.output[:] = ["token_embeds" if name == "inputs_embeds" else name for name in node.output]
    del graph.output[:]
    graph.input.append(helper.make_tensor_value_info("image_features", TensorProto.FLOAT,
                                                     ["num_image_tokens", hidden]))
    graph.output.append(out)
    const = [helper.make_tensor("splice/image_token_id", TensorProto.INT64, [], [image_token_id]),
             helper.make_tensor("splice/flat", TensorProto.INT64, [1], [-1]),
             helper.make_tensor("splice/one", TensorProto.INT64, [], [1]),
             helper.make_tensor("splice/axis0", TensorProto.INT64, [], [0]),
             helper.make_tensor("splice/last", TensorProto.INT64, [1], [-1]),
             helper.make_tensor("splice/zero_row", TensorProto.FLOAT, [1, hidden], np.zeros(hidden).tolist())]
    graph.initializer.extend(const)
    n = helper.make_node
    graph.node.extend([
        n("Equal", ["input_ids", "splice/image_token_id"], ["splice/is_image"]),
        n("Reshape", ["splice/is_image", "splice/flat"], ["splice/is_image_flat"]),
        n("Cast", ["splice/is_image_flat"], ["splice/is_image_int"], to=TensorProto.INT64),
        n("CumSum", ["splice/is_image_int", "splice/axis0"], ["splice/count"]),
        n("Sub", ["splice/count", "splice/one"], ["splice/row"]),  # k-th image token -> feature row k
        n("Shape", ["image_features"], ["splice/features_shape"], start=0, end=1),
        n("Squeeze", ["splice/features_shape"], ["splice/n"]),
        n("Where", ["splice/is_image_flat", "splice/row", "splice/n"], ["splice/index"]),
        n("Concat", ["image_features", "splice/zero_row"], ["splice/padded"], axis=0),
        n("Gather", ["splice/padded", "splice/index"], ["splice/rows"], axis=0),
        n("Shape", ["token_embeds"], ["splice/embeds_shape"]),
        n("Reshape", ["splice/rows", "splice/embeds_shape"], ["splice/image_rows"]),
        n("Unsqueeze", ["splice/is_image", "splice/last"], ["splice/mask"]),
        n("Where", ["splice/mask", "splice/image_rows", "token_embeds"], ["inputs_embeds"]),
    ])
    onnx.checker.check_model(embed)
    return embed


def processor_config(preprocessor: Mapping[str, Any]) -> dict[str, Any]:
    """onnxruntime-extensions' image pipeline for genai's ``QwenImageProcessor`` from a Qwen
    ``preprocessor_config.json`` (its pixel budget, mean/std, patch and merge sizes)."""
    size = preprocessor.get("size") or {}
    patch, merge = int(preprocessor.get("patch_size", 14)), int(preprocessor.get("merge_size", 2))

    def op(name: str, kind: str, **attrs: Any) -> dict[str, Any]:
        return {"operation": {"name": name, "type": kind, **({"attrs": attrs} if attrs else {})}}

    return {"processor": {"name": "qwen2_5_image_processor", "transforms": [
        op("decode_image", "DecodeImage", color_space="RGB"),
        op("convert_to_rgb", "ConvertRGB"),
        op("resize", "Resize", width=540, height=360, smart_resize=1,
           min_pixels=int(preprocessor.get("min_pixels") or size.get("shortest_edge", 56 * 56)),
           max_pixels=int(preprocessor.get("max_pixels") or size.get("longest_edge", 28 * 28 * 1280)),
           patch_size=patch, merge_size=merge),
        op("rescale", "Rescale", rescale_factor=float(preprocessor.get("rescale_factor", 1 / 255))),
        op("normalize", "Normalize", mean=list(preprocessor["image_mean"]), std=list(preprocessor["image_std"]),
           qwen2_5_vl=1),
        op("patch_image", "PatchImage", patch_size=patch,
           temporal_patch_size=int(preprocessor.get("temporal_patch_size", 2)), merge_size=merge)]}}


def genai_vlm_config(config: Mapping[str, Any], generation: Mapping[str, Any], *, layers: int, kv_heads: int,
                     head_size: int, threads: int = 1) -> dict[str, Any]:
    """genai's ``genai_config.json`` for the three files above (``config``: the transformers
    ``config.json`` of the Qwen2.5-VL model)."""
    text = {**config, **(config.get("text_config") or {})}
    vision = config["vision_config"]
    eos = generation.get("eos_token_id", text.get("eos_token_id"))
    eos = list(eos) if isinstance(eos, (list, tuple)) else [eos]
    session = {"log_id": "edge-runtime", "intra_op_num_threads": threads, "inter_op_num_threads": 1,
               "provider_options": []}
    return {"model": {
        "type": "qwen2_5_vl", "vocab_size": int(text["vocab_size"]),
        "context_length": int(text.get("max_position_embeddings", 4096)),
        "bos_token_id": int(generation.get("bos_token_id", text.get("bos_token_id", 0))),
        "eos_token_id": eos, "pad_token_id": int(generation.get("pad_token_id", eos[-1])),
        "image_token_id": int(config["image_token_id"]), "video_token_id": int(config["video_token_id"]),
        "vision_start_token_id": int(config["vision_start_token_id"]),
        "decoder": {"filename": DECODER_FILE, "session_options": dict(session), "head_size": head_size,
                    "hidden_size": int(text["hidden_size"]), "num_attention_heads": int(text["num_attention_heads"]),
                    "num_hidden_layers": layers, "num_key_value_heads": kv_heads,
                    "inputs": {"inputs_embeds": "inputs_embeds", "attention_mask": "attention_mask",
                               "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
                               "past_value_names": "past_key_values.%d.value"},
                    "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                                "present_value_names": "present.%d.value"}},
        "embedding": {"filename": EMBEDDING_FILE, "session_options": dict(session),
                      "inputs": {"input_ids": "input_ids", "image_features": "image_features"},
                      "outputs": {"inputs_embeds": "inputs_embeds"}},
        "vision": {"filename": VISION_FILE, "config_filename": PROCESSOR_FILE, "session_options": dict(session),
                   "spatial_merge_size": int(vision.get("spatial_merge_size", 2)),
                   "patch_size": int(vision.get("patch_size", 14)), "window_size": int(vision.get("window_size", 112)),
                   "tokens_per_second": float(vision.get("tokens_per_second", 2)),
                   "inputs": {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"},
                   "outputs": {"image_features": "image_features"}}},
        # our decoder concatenates past and new KV: genai must not share one buffer between them
        "search": {"past_present_share_buffer": False, "do_sample": False, "num_beams": 1,
                   "max_length": int(text.get("max_position_embeddings", 4096))}}


def write_genai_vlm_folder(source: Path, out: Path, threads: int = 1) -> Path:
    """``out`` as described in the module docstring, from the transformers.js-layout ``source``
    (fp32 parts); ValueError for a family other than ``qwen2_5_vl``."""
    import onnx

    source, out = Path(source), Path(out)
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") != "qwen2_5_vl":
        raise ValueError(f"{source}: model_type {config.get('model_type')!r}; onnxruntime-genai's VLM layout is "
                         "written for qwen2_5_vl only")
    generation = json.loads((source / "generation_config.json").read_text(encoding="utf-8"))
    preprocessor = json.loads((source / "preprocessor_config.json").read_text(encoding="utf-8"))
    out.mkdir(parents=True, exist_ok=True)
    onnx_dir = source / "onnx"
    shutil.copyfile(onnx_dir / "vision_encoder.onnx", out / VISION_FILE)
    if (onnx_dir / "vision_encoder.onnx_data").is_file():  # the graph names its data file: the same name here
        shutil.copyfile(onnx_dir / "vision_encoder.onnx_data", out / "vision_encoder.onnx_data")
    for path in onnx_dir.glob("decoder_model_merged.onnx*"):  # the graph and its external data, same names
        shutil.copyfile(path, out / path.name)
    text = {**config, **(config.get("text_config") or {})}
    hidden = int(text["hidden_size"])
    embed = onnx.load(str(onnx_dir / "embed_tokens.onnx"))
    onnx.save(splicing_embedding(embed, int(config["image_token_id"]), hidden), str(out / EMBEDDING_FILE))
    decoder = onnx.load(str(out / DECODER_FILE), load_external_data=False)
    past = [v for v in decoder.graph.input if v.name.startswith("past_key_values.") and v.name.endswith(".key")]
    dims = past[0].type.tensor_type.shape.dim
    (out / "genai_config.json").write_text(json.dumps(genai_vlm_config(
        config, generation, layers=len(past), kv_heads=dims[1].dim_value, head_size=dims[3].dim_value,
        threads=threads), indent=2))
    (out / PROCESSOR_FILE).write_text(json.dumps(processor_config(preprocessor), indent=2))
    for name in _COPIED:
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)
    return out
