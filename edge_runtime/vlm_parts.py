"""The three ONNX parts of a VLM (transformers.js layout) from a transformers config and its weights.

``iter_vlm_parts(config, weights)`` yields the ``vision_encoder``, ``embed_tokens`` and
``decoder_model_merged`` graphs one at a time (``build_vlm_parts``: as a dict), built with
``onnx.helper`` (no torch): the config is the ``config.json`` of the
``*ForConditionalGeneration`` model, the weights are named as its ``model.safetensors``
names them (the legacy ``visual.*`` / ``model.*`` names transformers saves for Qwen2-VL,
or the newer ``model.visual.*`` / ``model.language_model.*``; both are accepted). Families:
Qwen2-VL, Qwen2.5-VL, Idefics3, SmolVLM, GLM-4.1V (``glm4v``: ``vision_graphs_glm4v`` and the
decoder with GLM-4's partial interleaved rotary and post-norms, its fused ``gate_up_proj`` read
as two halves) and Qwen3-VL (``qwen3_vl``: ``vision_graphs_qwen3vl``; a Qwen3 decoder with
interleaved M-RoPE whose ``inputs_embeds`` also carries the DeepStack feature sets, which
``embed_tokens`` pads with zeros on text rows and the vision encoder appends to its image rows).
``save_parts`` writes them as ``onnx/<part>.onnx`` (+ ``_fp16``). Used by ``vlm_zoo``
(random weights) and by the converter (a checkpoint's weights): both write the same graphs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from edge_runtime.decoder_zoo import DecoderShape, build_decoder
from edge_runtime.generation.vision.families import FAMILIES, MROPE_FAMILIES
from edge_runtime.model_zoo import IN_MEMORY_CHECK_BYTES, _GraphBuilder, external_weights, initializer_bytes

log = logging.getLogger(__name__)

# Which tower each family's converter builds (the families themselves: generation.vision.families)
QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl")
GLM_FAMILIES = ("glm4v",)
QWEN3_FAMILIES = ("qwen3_vl",)
# M-RoPE families (decoder position_ids [3, batch, seq]) name their towers model.visual.* and their text
# models model.language_model.*
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's fields: ``text_config`` over the top level (older checkpoints keep them flat)."""
    flat = {k: v for k, v in config.items() if k not in ("text_config", "vision_config")}
    return {**flat, **(config.get("text_config") or {})}


def decoder_shape(config: Mapping[str, Any]) -> DecoderShape:
    text = text_config(config)
    heads = text["num_attention_heads"]
    glm = config.get("model_type") in GLM_FAMILIES
    qwen3 = config.get("model_type") in QWEN3_FAMILIES
    head_dim = int(text.get("head_dim") or 0) if qwen3 else 0
    head_dim = head_dim or text["hidden_size"] // heads
    factor = float(text.get("partial_rotary_factor", 1.0))
    if factor != 1.0 and not glm:
        raise ValueError(f"partial_rotary_factor {factor} is built for glm4v only")
    rotary_dim = int(head_dim * factor)  # transformers' int(head_dim * partial_rotary_factor)
    shape = DecoderShape(hidden=text["hidden_size"], layers=text["num_hidden_layers"], heads=heads,
                         kv_heads=text.get("num_key_value_heads") or heads, intermediate=text["intermediate_size"],
                         vocab=text["vocab_size"], max_positions=text.get("max_position_embeddings", 2048),
                         rope_theta=float(text.get("rope_theta", 10000.0)), rms_eps=text.get("rms_norm_eps", 1e-6),
                         rotary_dim=rotary_dim if rotary_dim != head_dim else 0, rotary_interleaved=glm,
                         post_norms=glm, attention_head_dim=head_dim if qwen3 else 0, qk_norm=qwen3,
                         mrope_interleaved=qwen3, deepstack=len((config.get("vision_config") or {}).get(
                             "deepstack_visual_indexes") or ()) if qwen3 else 0)
    if text.get("hidden_act", "silu") != "silu":
        raise ValueError(f"text hidden_act {text['hidden_act']!r} is not supported: expected silu")
    rope = text.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "mrope"):  # scaled RoPE (llama3, yarn, dynamic...) would be silently wrong
        raise ValueError(f"text rope_scaling type {kind!r} is not supported: expected default or mrope")
    if text.get("head_dim") not in (None, shape.head_dim):
        raise ValueError(f"text head_dim {text['head_dim']} != hidden_size / num_attention_heads = {shape.head_dim}: "
                         "not supported")
    return shape


def mrope_section(config: Mapping[str, Any]) -> tuple[int, ...]:
    rope = text_config(config).get("rope_scaling") or {}
    if "mrope_section" not in rope:
        raise ValueError(f"{config.get('model_type')}: rope_scaling.mrope_section is missing from the config")
    return tuple(int(n) for n in rope["mrope_section"])


class RenamedWeights(Mapping[str, np.ndarray]):
    """A read-only view of ``source`` under other names (``names``: new -> old). Nothing is copied:
    a lazily decoded checkpoint (``vision_convert``) converts each tensor only when a builder reads
    it, so a part's weights need not all be resident at once."""

    def __init__(self, source: Mapping[str, np.ndarray], names: dict[str, str]) -> None:
        self.source, self.names = source, names

    def __getitem__(self, name: str) -> np.ndarray:
        return self.source[self.names[name]]

    def __contains__(self, name: object) -> bool:  # without decoding the weight (Mapping's reads it)
        return name in self.names

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


class GateUpSplit(Mapping[str, np.ndarray]):
    """GLM-4's fused ``mlp.gate_up_proj.weight`` [2 * intermediate, hidden] read as Qwen2's ``mlp.gate_proj`` and
    ``mlp.up_proj`` (its first and second halves, transformers' ``chunk(2)``); other names pass through."""

    def __init__(self, source: Mapping[str, np.ndarray]) -> None:
        self.source = source
        self.halves = {}
        for name in source:
            if name.endswith("mlp.gate_up_proj.weight"):
                stem = name[:-len("gate_up_proj.weight")]
                self.halves[stem + "gate_proj.weight"], self.halves[stem + "up_proj.weight"] = (name, 0), (name, 1)
        self.names = [n for n in source if not n.endswith("mlp.gate_up_proj.weight")] + list(self.halves)

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.halves:
            fused, half = self.halves[name]
            return np.array_split(self.source[fused], 2, axis=0)[half]
        if name.endswith("mlp.gate_up_proj.weight"):
            raise KeyError(name)
        return self.source[name]

    def __contains__(self, name: object) -> bool:
        return name in self.halves or (isinstance(name, str) and not name.endswith("mlp.gate_up_proj.weight")
                                       and name in self.source)

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def text_weights(family: str, weights: Mapping[str, np.ndarray], tied: bool = False) -> Mapping[str, np.ndarray]:
    """The decoder's weights under Qwen2's names (``model.layers.N...``, ``model.norm``, ``lm_head``);
    ``tied``: without ``lm_head`` (the decoder then ties the head to the embedding table)."""
    prefix = "model.language_model." if family in MROPE_FAMILIES else "model.text_model."
    names = {}
    for name in weights:
        new = "model." + name[len(prefix):] if name.startswith(prefix) else name
        if new.startswith("model.") and not new.startswith(("model.visual.", "model.vision_model.",
                                                           "model.connector.")) or (new == "lm_head.weight"
                                                                                    and not tied):
            names[new] = name
    renamed = RenamedWeights(weights, names)
    return GateUpSplit(renamed) if family in GLM_FAMILIES else renamed


def vision_weights(family: str, weights: Mapping[str, np.ndarray]) -> RenamedWeights:
    """The vision tower's weights: ``visual.*`` (Qwen, GLM) or ``model.vision_model.*`` + ``model.connector.*``."""
    if family in MROPE_FAMILIES:
        names = {("visual." + k[len("model.visual."):] if k.startswith("model.visual.") else k): k
                 for k in weights if k.startswith(("visual.", "model.visual."))}
    else:
        names = {k: k for k in weights if k.startswith(("model.vision_model.", "model.connector."))}
    return RenamedWeights(weights, names)


def build_embed_tokens(table: np.ndarray, zero_columns: int = 0) -> onnx.ModelProto:
    """``input_ids`` [batch, seq] -> ``inputs_embeds`` [batch, seq, hidden]: one Gather; with ``zero_columns``
    (Qwen3-VL: room for the DeepStack sets, which only image rows carry) a Pad of that many zeros after."""
    table = np.asarray(table, np.float32)
    g = _GraphBuilder(0)
    rows = g.op("Gather", [g.const("embed_tokens.weight", table), "input_ids"])
    if zero_columns:
        g.op("Pad", [rows, g.const("pads", np.array([0, 0, 0, 0, 0, zero_columns], np.int64))])
    g.nodes[-1].output[0] = "inputs_embeds"
    return g.model("embed_tokens",
                   [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])],
                   [helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT,
                                                  ["batch_size", "sequence_length", table.shape[1] + zero_columns])])


def check_vlm_config(config: Mapping[str, Any]) -> tuple[str, DecoderShape, tuple[int, ...] | None, Any]:
    """(family, decoder shape, M-RoPE sections or None, vision spec): ValueError or KeyError for a config
    the graphs do not cover, before anything is built."""
    family = config.get("model_type")
    if family not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {family!r} is not supported: expected one of {list(SUPPORTED_MODEL_TYPES)}")
    if family == "qwen2_vl":
        from edge_runtime.vision_graphs import qwen_vision_spec as vision_spec
    elif family == "qwen2_5_vl":
        from edge_runtime.vision_graphs_qwen25 import qwen25_vision_spec as vision_spec
    elif family == "glm4v":
        from edge_runtime.vision_graphs_glm4v import glm_vision_spec as vision_spec
    elif family == "qwen3_vl":
        from edge_runtime.vision_graphs_qwen3vl import qwen3_vision_spec as vision_spec
    else:
        from edge_runtime.vision_graphs_idefics import idefics_vision_spec as vision_spec
    mrope, shape = mrope_section(config) if family in MROPE_FAMILIES else None, decoder_shape(config)
    if mrope and 2 * sum(mrope) != shape.rotated_dim:
        raise ValueError(f"mrope_section {list(mrope)} sums to {sum(mrope)}; expected half the rotated channels, "
                         f"{shape.rotated_dim // 2}")
    return family, shape, mrope, vision_spec(config)


def build_vlm_decoder(shape: DecoderShape, weights: Mapping[str, np.ndarray], mrope: tuple[int, ...] | None,
                      fused: bool) -> onnx.ModelProto:
    """``decoder_model_merged``: ``decoder_fused``'s graph (GroupQueryAttention, KV appended in place;
    M-RoPE rotated before it) when ``fused`` and ONNX Runtime can run it for ``shape``, else
    ``decoder_zoo``'s standard-ops graph. Same inputs and outputs either way."""
    if fused:
        from edge_runtime.decoder_fused import build_fused_decoder, unfusable

        reason = unfusable(shape)
        if reason is None:
            return build_fused_decoder(shape, weights, inputs_embeds=True, mrope_section=mrope)
        log.info("writing the unfused VLM decoder graph: %s", reason)
    return build_decoder(shape, weights, inputs_embeds=True, mrope_section=mrope)


def iter_vlm_parts(config: Mapping[str, Any], weights: Mapping[str, np.ndarray], data_dir: Path | None = None,
                   fused: bool = False, fused_decoder: bool = True) -> Iterator[tuple[str, onnx.ModelProto]]:
    """The three graphs for ``config["model_type"]`` (one of ``SUPPORTED_MODEL_TYPES``), built one at a
    time. ``weights`` may be any mapping giving float32 arrays on access. With ``data_dir`` each part's
    weights go straight to ``data_dir/<part>.onnx_data`` as it is built (``model_zoo.external_weights``):
    a converter then holds about one tensor in memory, not a part of several GB. ``fused``: the vision
    encoder's attention as ONNX Runtime's ``MultiHeadAttention`` (fast on ORT's CPU; a ``gpu`` plan's
    OpenCL/Vulkan backends leave it to the host) instead of standard ops. ``fused_decoder`` (default):
    the decoder as ``build_vlm_decoder``'s fused graph (faster prefill, KV cache appended in place);
    False: standard ops only."""
    family, shape, mrope, spec = check_vlm_config(config)
    text = text_weights(family, weights, tied=bool(text_config(config).get("tie_word_embeddings")))
    vision = vision_weights(family, weights)
    if family == "qwen2_vl":
        from edge_runtime.vision_graphs import build_qwen2_vl_vision as build_vision
    elif family == "qwen2_5_vl":
        from edge_runtime.vision_graphs_qwen25 import build_qwen2_5_vl_vision as build_vision
    elif family == "glm4v":
        from edge_runtime.vision_graphs_glm4v import build_glm4v_vision as build_vision
    elif family == "qwen3_vl":
        from edge_runtime.vision_graphs_qwen3vl import build_qwen3_vl_vision as build_vision
    else:
        from edge_runtime.vision_graphs_idefics import build_idefics3_vision as build_vision
    builders = {"vision_encoder": lambda: build_vision(spec, vision, fused=fused),
                "embed_tokens": lambda: build_embed_tokens(text["model.embed_tokens.weight"],
                                                           shape.embeds_width - shape.hidden),
                "decoder_model_merged": lambda: build_vlm_decoder(shape, text, mrope, fused_decoder)}
    for name, build in builders.items():
        if data_dir is None:
            yield name, build()
        else:
            with external_weights(Path(data_dir) / f"{name}.onnx_data"):
                part = build()
            yield name, part


def iter_quantized_decoders(config: Mapping[str, Any], weights: Mapping[str, np.ndarray], data_dir: Path,
                            fused_decoder: bool = True) -> Iterator[tuple[str, onnx.ModelProto]]:
    """``decoder_model_merged_q4`` / ``_int8`` (weight-only ``MatMulNBits``) and ``_quantized`` (per-token
    int8), as ``vlm_quant`` writes them from the fp32 decoder, but built from the checkpoint's weights,
    each quantized as it is read (``vlm_quant.QuantizedOnRead``) and written straight to
    ``data_dir/<part>.onnx_data``: the MatMulNBits decoders hold a weight at a time, the per-token one
    its int8 graph (a quarter of the fp32 one) for the rewrite, where quantizing the written fp32
    decoder holds all of its fp32 weights."""
    from edge_runtime.vlm_quant import DECODER_BITS, Int8Quantized, NBitsQuantized, per_token_given

    family, shape, mrope, _ = check_vlm_config(config)
    text = text_weights(family, weights, tied=bool(text_config(config).get("tie_word_embeddings")))
    for precision, bits in DECODER_BITS.items():
        name = f"decoder_model_merged_{precision}"
        with external_weights(Path(data_dir) / f"{name}.onnx_data"):
            part = build_vlm_decoder(shape, NBitsQuantized(text, bits), mrope, fused_decoder)
        yield name, part
    staging = Path(data_dir) / "decoder_model_merged_quantized.staging.onnx"
    try:
        with external_weights(staging.with_name(staging.name + "_data")):
            part = build_vlm_decoder(shape, Int8Quantized(text), mrope, fused_decoder)
        onnx.save(part, str(staging))
        del part
        part = onnx.load(str(staging))  # int8 weights in memory: the rewrite reads them
    finally:
        staging.unlink(missing_ok=True)
        staging.with_name(staging.name + "_data").unlink(missing_ok=True)
    yield "decoder_model_merged_quantized", per_token_given(part)


def build_vlm_parts(config: Mapping[str, Any], weights: Mapping[str, np.ndarray], fused: bool = False,
                    fused_decoder: bool = True) -> dict[str, onnx.ModelProto]:
    """``iter_vlm_parts`` as a dict."""
    return dict(iter_vlm_parts(config, weights, fused=fused, fused_decoder=fused_decoder))


def save_part(proto: onnx.ModelProto, onnx_dir: Path, stem: str, external: dict[str, int]) -> None:
    """Write ``proto`` as ``onnx_dir/<stem>.onnx`` with its weights in ``<stem>.onnx_data``, noting the data
    file in ``external`` (transformers.js' map).

    Every part keeps its weights beside the graph, not only the large ones: ONNX Runtime maps such a file
    into memory, and the weights its kernels pre-pack (every MatMul's) then stay file-backed pages the
    system can drop, where weights inside the protobuf are copied to the heap and kept beside the packed
    copies (the benchmark VLM of ``tools/bench_vlm.py``, fp32, after one image request: 365 MiB of
    anonymous memory with its 71 MB encoder inside the protobuf, 255 with every part beside it)."""
    path, data = onnx_dir / f"{stem}.onnx", onnx_dir / f"{stem}.onnx_data"
    path.unlink(missing_ok=True)
    streamed = any(t.data_location == TensorProto.EXTERNAL for t in proto.graph.initializer)
    weight_bytes = initializer_bytes(proto)
    if streamed:  # the builder wrote the data file as it made the weights
        onnx.save(proto, str(path))
    else:
        data.unlink(missing_ok=True)
        onnx.save(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=data.name, size_threshold=1024)
    if data.is_file():
        data.chmod(0o644)
        external[path.name] = 1
    if streamed or weight_bytes >= IN_MEMORY_CHECK_BYTES:  # not checked when built (model_zoo): check the file
        onnx.checker.check_model(str(path))


def save_parts(folder: Path, parts: Mapping[str, onnx.ModelProto] | Iterable[tuple[str, onnx.ModelProto]],
               fp16: bool = False) -> dict[str, int]:
    """Write ``folder/onnx/<part>.onnx`` (and ``<part>_fp16.onnx`` when ``fp16``) for each (name, graph),
    dropping each graph once written; returns the ``transformers.js_config.use_external_data_format``
    map (file name -> number of data chunks)."""
    onnx_dir = Path(folder) / "onnx"
    onnx_dir.mkdir(parents=True, exist_ok=True)
    external = {}
    for name, model in (parts.items() if isinstance(parts, Mapping) else parts):
        save_part(model, onnx_dir, name, external)
        if fp16:
            from onnxruntime.transformers.float16 import convert_float_to_float16

            # from the saved file (saving moved the weights out of ``model``); keep_io_types: the host
            # feeds float32 either way, weights and arithmetic are fp16 inside
            half = convert_float_to_float16(onnx.load(str(onnx_dir / f"{name}.onnx")), keep_io_types=True,
                                            disable_shape_infer=True)
            save_part(half, onnx_dir, name + "_fp16", external)
            del half
        del model  # before the generator builds the next part
    return external
