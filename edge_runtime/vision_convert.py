"""``edge-runtime convert HF_FOLDER --to onnx --out DIR``: a transformers VLM checkpoint -> transformers.js layout.

Reads ``config.json`` and the safetensors weights (one file or an index of shards;
float32, float16 or bfloat16), builds the three graphs with ``onnx.helper``
(``edge_runtime.vlm_parts``: no torch, no transformers) and writes
``DIR/onnx/{vision_encoder,embed_tokens,decoder_model_merged}.onnx`` (``_fp16``
variants with ``--precision fp16``; ``_quantized``, ``_q4`` and ``_int8`` ones with
``--quantize``: ``vlm_quant``), ``config.json`` (the checkpoint's, plus the fields
transformers.js reads: flat text sizes for Qwen2-VL, ``transformers.js_config``),
and copies the tokenizer, processor and chat-template files. A ``chat_template.jinja``
is also folded into ``tokenizer_config.json``, where transformers.js's tokenizer looks.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.errors import ModelLoadError

log = logging.getLogger(__name__)

COPIED_FILES = ("generation_config.json", "preprocessor_config.json", "processor_config.json",
                "video_preprocessor_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja",
                "chat_template.json")
# text fields transformers.js's config normaliser reads at the top level for qwen2_vl
FLAT_TEXT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "max_position_embeddings", "rope_theta", "rms_norm_eps", "rope_scaling")
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64, "I32": np.int32}


class SafetensorsWeights(Mapping[str, np.ndarray]):
    """The tensors of ``.safetensors`` files, decoded on access as float32 (integers as they are).

    By hand because ``safetensors.numpy`` refuses bfloat16 (numpy has no such dtype), the dtype
    most released VLM checkpoints use; the format is an 8-byte header length, a JSON header of
    dtype/shape/byte offsets, then the raw little-endian data. Files are memory-mapped and nothing
    is cached, so converting a multi-GB checkpoint holds only the tensors a builder is using."""

    def __init__(self, paths: list[Path]) -> None:
        self.index: dict[str, tuple[np.memmap, int, dict]] = {}
        for path in paths:
            raw = np.memmap(path, dtype=np.uint8, mode="r")
            (length,) = struct.unpack("<Q", bytes(raw[:8]))
            for name, info in json.loads(bytes(raw[8:8 + length])).items():
                if name == "__metadata__":
                    continue
                if info["dtype"] not in _DTYPES:
                    raise ModelLoadError(f"{path}: tensor {name} has dtype {info['dtype']}; expected one of "
                                         f"{sorted(_DTYPES)}")
                self.index[name] = (raw, 8 + length, info)

    def __getitem__(self, name: str) -> np.ndarray:
        raw, base, info = self.index[name]
        start, end = info["data_offsets"]
        array = np.frombuffer(raw[base + start:base + end], dtype=_DTYPES[info["dtype"]]).reshape(info["shape"])
        if info["dtype"] == "BF16":  # bfloat16 is the high half of a float32
            return (array.astype(np.uint32) << 16).view(np.float32)
        return array.astype(np.float32) if info["dtype"] == "F16" else array

    def __iter__(self):
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)


def read_checkpoint(folder: Path) -> SafetensorsWeights:
    """The weights of ``model.safetensors`` or of the shards named by ``model.safetensors.index.json``."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ModelLoadError(f"{folder}: no model.safetensors or model.safetensors.index.json (only safetensors "
                             "checkpoints are converted; save with save_pretrained(safe_serialization=True))")
    return SafetensorsWeights([folder / name for name in files])


def output_config(config: dict[str, Any], external: dict[str, int]) -> dict[str, Any]:
    from edge_runtime.vlm_parts import QWEN_FAMILIES, text_config

    out = dict(config)
    if config["model_type"] in QWEN_FAMILIES:
        text = text_config(config)
        out.update({k: text[k] for k in FLAT_TEXT_FIELDS if k in text and k not in out})
    js = dict(out.get("transformers.js_config") or {})
    js["use_external_data_format"] = external
    out["transformers.js_config"] = js
    return out


def _fold_chat_template(hf_folder: Path, tokenizer_config: Path) -> None:
    """Newer checkpoints keep the template in chat_template.jinja (or the processor's chat_template.json)."""
    if not tokenizer_config.is_file():
        return
    settings = json.loads(tokenizer_config.read_text())
    if settings.get("chat_template"):
        return
    if (hf_folder / "chat_template.jinja").is_file():
        settings["chat_template"] = (hf_folder / "chat_template.jinja").read_text()
    elif (hf_folder / "chat_template.json").is_file():
        settings["chat_template"] = json.loads((hf_folder / "chat_template.json").read_text())["chat_template"]
    else:
        return
    tokenizer_config.write_text(json.dumps(settings, indent=2))


def convert_vlm_folder(hf_folder: Path, out: Path, fp16: bool = False, fused: bool = True,
                       quantize: bool = False) -> Path:
    """Write the transformers.js layout for the checkpoint in ``hf_folder`` into ``out``; returns ``out``.

    ``fused``: the vision encoder's attention as ONNX Runtime's ``MultiHeadAttention`` (the CPU's fast
    form, flash attention for one image) and the decoder's as its ``GroupQueryAttention`` (faster
    prefill, KV appended in place); False: standard ops only in both, for ``gpu`` plans whose backends
    should take the attention too and for runtimes without ONNX Runtime's contrib ops
    (``vlm_parts.iter_vlm_parts``). ``quantize``: also the q8 vision encoder and the q8/q4/int8 decoders
    (``vlm_quant``)."""
    from edge_runtime.vlm_parts import SUPPORTED_MODEL_TYPES, check_vlm_config, iter_vlm_parts, save_parts

    hf_folder, out = Path(hf_folder), Path(out)
    config_path = hf_folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{hf_folder}: no config.json (expected a transformers checkpoint folder)")
    config = json.loads(config_path.read_text())
    family = config.get("model_type")
    if family not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(f"{hf_folder}: model_type {family!r} cannot be converted to onnx; supported: "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    if out.resolve() == hf_folder.resolve():
        raise ModelLoadError(f"--out {out} is the checkpoint folder itself; choose a new folder")
    weights = read_checkpoint(hf_folder)
    try:
        check_vlm_config(config)  # refuse before writing anything
        out.mkdir(parents=True, exist_ok=True)
        (out / "onnx").mkdir(exist_ok=True)
        external = save_parts(out, iter_vlm_parts(config, weights, data_dir=out / "onnx", fused=fused,
                                                      fused_decoder=fused), fp16)
    except KeyError as exc:
        raise ModelLoadError(f"{hf_folder}: the checkpoint lacks weight or config field {exc} that "
                             f"model_type {family!r} needs") from None
    except ValueError as exc:  # a config the graphs do not cover (scaled RoPE, odd head_dim, activation)
        raise ModelLoadError(f"{hf_folder}: {exc}") from None
    for name in COPIED_FILES:
        if (hf_folder / name).is_file():
            shutil.copyfile(hf_folder / name, out / name)
    _fold_chat_template(hf_folder, out / "tokenizer_config.json")
    if quantize:
        from edge_runtime.vlm_parts import iter_quantized_decoders
        from edge_runtime.vlm_quant import write_quantized_parts

        try:
            external.update(save_parts(out, iter_quantized_decoders(config, weights, out / "onnx", fused)))
            external.update(write_quantized_parts(out, decoders=False))
        except Exception as exc:  # onnxruntime's quantizers raise ValueError/AssertionError/onnx errors alike
            raise ModelLoadError(f"{hf_folder}: quantizing the converted parts failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
    (out / "config.json").write_text(json.dumps(output_config(config, external), indent=2))
    log.info("converted %s (%s) to %s", hf_folder, family, out)
    return out
