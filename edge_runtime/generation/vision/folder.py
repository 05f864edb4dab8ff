"""A vision-language model folder in the transformers.js (onnx-community) layout, read into a typed description.

::

    config.json  generation_config.json  preprocessor_config.json  tokenizer.json  tokenizer_config.json
    onnx/vision_encoder{,_fp16,_quantized,_int8,_uint8,_q4,_q4f16,_bnb4}.onnx
    onnx/embed_tokens{...}.onnx
    onnx/decoder_model_merged{...}.onnx      (external data: <file>_data)

The decoder takes ``inputs_embeds`` instead of ``input_ids`` and otherwise
follows the ``optimum`` decoder convention (``past_key_values.N.key/value`` →
``present.N.key/value``), so its KV layout is read as a text decoder's is
(``generation.folder.describe_decoder``). Qwen2-VL, Qwen2.5-VL, GLM-4.1V and Qwen3-VL decoders take
M-RoPE ``position_ids`` [3, batch, seq]; Idefics3 / SmolVLM ones [batch, seq]. Qwen3-VL's
``inputs_embeds`` is wider than its hidden size (the DeepStack sets ride along, ``vlm_parts``): the
width the engine embeds, splices and feeds is always the decoder input's.
Which file of each part is loaded is a per-model setting (``[vision]
precision``, see ``settings``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from edge_runtime.errors import ModelLoadError, ModelNotFoundError
from edge_runtime.generation.folder import DecoderFolder, describe_decoder, read_json, weight_files
from edge_runtime.generation.folder import PRECISION_ORDER, SUFFIXES
from edge_runtime.generation.vision.families import FAMILIES
from edge_runtime.generation.vision.settings import PARTS, VisionSettings

ONNX_DIR = "onnx"
FILE_STEMS = {"decoder": "decoder_model_merged", "embed_tokens": "embed_tokens", "vision_encoder": "vision_encoder"}


def is_vlm_folder(folder: Path) -> bool:
    """True when ``folder`` has a tokenizer, ``config.json`` and some file of each of the three parts
    under ``onnx/``. Reads no ONNX."""
    folder = Path(folder)
    if not ((folder / "tokenizer.json").is_file() and (folder / "config.json").is_file()):
        return False
    return all(_present(folder, part) for part in PARTS)


def _present(folder: Path, part: str) -> dict[str, Path]:
    """The files of ``part`` present, by precision."""
    stem = FILE_STEMS[part]
    found = {name: folder / ONNX_DIR / f"{stem}{suffix}.onnx" for name, suffix in SUFFIXES.items()}
    return {name: path for name, path in found.items() if path.is_file()}


def part_file(folder: Path, part: str, precision: str | None) -> tuple[str, Path]:
    """(precision, file) of ``part``: the one set, else the first present in ``PRECISION_ORDER``.

    Raises ModelLoadError naming the files present when the set precision has no file.
    """
    present = _present(folder, part)
    if precision is not None:
        if precision not in present:
            raise ModelLoadError(f"{folder}: [vision] precision.{part} = {precision!r}, but there is no "
                                 f"{ONNX_DIR}/{FILE_STEMS[part]}{SUFFIXES[precision]}.onnx (present: "
                                 f"{sorted(present) or 'none'})")
        return precision, present[precision]
    for name in PRECISION_ORDER:
        if name in present:
            return name, present[name]
    raise ModelLoadError(f"{folder}: no {ONNX_DIR}/{FILE_STEMS[part]}*.onnx")


@dataclass(frozen=True)
class VLMFolder:
    """What the engine needs from a VLM folder, checked at load time."""

    path: Path
    family: str  # config.json model_type
    config: Mapping[str, Any]  # config.json as read (the preprocessor reads it too)
    decoder: DecoderFolder  # model_path: the chosen decoder file; weight_files: all three parts' files
    embed_path: Path
    vision_path: Path
    precisions: Mapping[str, str]  # part -> precision loaded
    image_token_id: int
    vision_start_token_id: int | None  # M-RoPE families: the token before each image's tokens
    spatial_merge_size: int  # qwen families: vision patches merged per image token, per side
    mrope: bool  # decoder position_ids are [3, batch, seq]
    hidden_size: int
    embeds_dtype: Any  # the decoder's inputs_embeds element type (np.float32 / np.float16)

    @property
    def weight_bytes(self) -> int:
        return self.decoder.weight_bytes


def _input_type(proto: Any, name: str) -> tuple[list[int | None], Any] | None:
    """(dims, numpy dtype) of graph input ``name``, or None when the graph has no such input."""
    import onnx

    for value in proto.graph.input:
        if value.name == name:
            tensor = value.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
            return dims, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).type
    return None


def read_vlm_folder(folder: Path, settings: VisionSettings | None = None) -> VLMFolder:
    """Describe a VLM folder with each part's file chosen by ``settings.precision``.

    Raises ModelNotFoundError (no folder), ModelLoadError naming what is missing or wrong.
    """
    folder = Path(folder)
    settings = settings or VisionSettings()
    if not folder.is_dir():
        raise ModelNotFoundError(f"model folder not found: {folder}")
    config = read_json(folder / "config.json")
    family = str(config.get("model_type", ""))
    if family not in FAMILIES:
        raise ModelLoadError(f"{folder}: config.json model_type {family!r} is not a supported vision-language "
                             f"model (supported: {list(FAMILIES)})")
    chosen = {part: part_file(folder, part, settings.precision_of(part)) for part in PARTS}
    text = {**config, **(config.get("text_config") or {}), "model_type": family}
    decoder = describe_decoder(folder, chosen["decoder"][1], text, read_json(folder / "generation_config.json"),
                               first_input="inputs_embeds")
    image_token_id = config.get("image_token_id", config.get("image_token_index"))
    if not isinstance(image_token_id, int):
        raise ModelLoadError(f"{folder}: config.json has no integer image_token_id")
    mrope = FAMILIES[family].mrope
    vision_config = config.get("vision_config") or {}
    start_key = FAMILIES[family].start_token_key  # "" for families without M-RoPE: no start id read
    start = config.get(start_key)
    if mrope and not isinstance(start, int):
        raise ModelLoadError(f"{folder}: config.json has no integer {start_key} ({family} needs it)")
    import onnx

    proto = onnx.load(str(decoder.model_path), load_external_data=False)
    embeds, positions = _input_type(proto, "inputs_embeds"), _input_type(proto, "position_ids")
    assert embeds is not None  # describe_decoder checked it
    want_rank = 3 if mrope else 2
    if positions is None or len(positions[0]) != want_rank:
        raise ModelLoadError(f"{decoder.model_path}: {family} needs position_ids of rank {want_rank} "
                             f"({'[3, batch, seq]' if mrope else '[batch, seq]'}), got "
                             f"{'none' if positions is None else positions[0]}")
    hidden = embeds[0][-1] or int(text.get("hidden_size") or 0)
    if not hidden:
        raise ModelLoadError(f"{decoder.model_path}: inputs_embeds' hidden size unknown (graph and config.json)")
    files = [*decoder.weight_files]
    for part in ("embed_tokens", "vision_encoder"):
        path = chosen[part][1]
        files += weight_files(path, onnx.load(str(path), load_external_data=False))
    decoder = dataclasses.replace(decoder, weight_files=tuple(files))
    return VLMFolder(folder, family, config, decoder, chosen["embed_tokens"][1], chosen["vision_encoder"][1],
                     {part: name for part, (name, _) in chosen.items()}, image_token_id,
                     start if isinstance(start, int) else None, int(vision_config.get("spatial_merge_size", 2)),
                     mrope, int(hidden), embeds[1])
