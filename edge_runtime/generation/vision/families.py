"""The vision-language families we run and convert, and what their folders differ in.

One table, read by the loader (``folder``), preprocessing (``preprocess``, ``qwen_preprocess``) and
the converter (``vlm_parts``, ``vlm_zoo``, ``vlm_files``): a family added here is known everywhere
at once, and a question such as "does its decoder take M-RoPE positions" has one answer. How each
family's graphs are built stays with the converter's modules (one per tower).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's
    preprocessing: str  # "qwen": patches and a t/h/w grid; "glm": Qwen's rules, two frames; "idefics": tiles
    mrope: bool  # the decoder takes position_ids [3, batch, seq] computed from the image grids
    grid_input: str = ""  # the vision encoder's grid input (Qwen-style towers)
    start_token_key: str = ""  # config.json's id of the token that opens an image (M-RoPE families)


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("qwen2_vl", "qwen", True, "grid_thw", "vision_start_token_id"),
    Family("qwen2_5_vl", "qwen", True, "image_grid_thw", "vision_start_token_id"),
    Family("idefics3", "idefics", False),
    Family("smolvlm", "idefics", False),
    Family("glm4v", "glm", True, "image_grid_thw", "image_start_token_id"),
    Family("qwen3_vl", "qwen", True, "image_grid_thw", "vision_start_token_id"),  # 16-px patches, same rules
)}  # in the order they were added (messages list them so)
MROPE_FAMILIES = tuple(name for name, family in FAMILIES.items() if family.mrope)
