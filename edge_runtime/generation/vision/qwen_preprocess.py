"""Qwen2-VL / Qwen2.5-VL and GLM-4.1V preprocessing, equal to transformers' ``Qwen2VLImageProcessor`` and
``Glm4vImageProcessor`` (slow paths).

One image is resized (``smart_resize``: sides multiples of patch*merge, area within
[min_pixels, max_pixels]), rescaled and normalised, repeated ``temporal_patch_size`` times
(a still image is a video of identical frames), and cut into patches flattened in the
order the vision encoder expects: rows grouped by merge window, each row
``[C, T, patch, patch]``. Its prompt text is ``<|image_pad|>`` once per merged patch.

GLM-4.1V's processor is the same but for its resize bounds and placeholder: ``smart_resize`` counts
a still image as its ``temporal_patch_size`` frames against ``min_pixels`` / ``max_pixels`` (its
``size.shortest_edge`` / ``longest_edge``), refuses sides shorter than ``patch * merge``, and the
prompt text is ``<|image|>`` once per merged patch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from edge_runtime.errors import ConfigError, InvalidInputError, ModelLoadError
from edge_runtime.generation.vision.families import FAMILIES
from edge_runtime.generation.vision.preprocess import (
    ImageProcessor,
    ProcessedImage,
    VisionBudget,
    channel_lut,
    config_int,
    normalized_chw,
    resample_filter,
    rgb,
)

if TYPE_CHECKING:
    from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 28 * 28 * 1280
MAX_ASPECT_RATIO = 200
_BICUBIC = 3


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int,
                 where: str = "image", frames: int = 1, min_side: int = 0) -> tuple[int, int]:
    """(height, width) rounded to multiples of ``factor`` with frames x the area in [min_pixels, max_pixels].

    Same arithmetic as transformers' ``smart_resize`` (Python's round-half-even included). GLM-4.1V's
    counts a still image as its ``frames`` (temporal_patch_size) copies and refuses a side shorter than
    ``min_side``; Qwen's takes one frame and no minimum.
    """
    if height < min_side or width < min_side:
        raise InvalidInputError(f"{where}: expected both sides at least {min_side} pixels, got {width}x{height}")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise InvalidInputError(f"{where}: expected an aspect ratio of at most {MAX_ASPECT_RATIO}, got "
                                f"{width}x{height} ({max(height, width) / min(height, width):.1f})")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if frames * h_bar * w_bar > max_pixels:
        beta = math.sqrt((frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif frames * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


class QwenImageProcessor(ImageProcessor):
    """``qwen2_vl`` (grid feed ``grid_thw``), ``qwen2_5_vl`` and ``qwen3_vl`` (grid feed ``image_grid_thw``;
    Qwen3-VL's 16-px patches come from its ``patch_size``)."""

    placeholder = "<|image_pad|>"
    default_min_pixels, default_max_pixels = DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS
    # transformers' Qwen2VLImageProcessor arguments: size = {shortest_edge: min_pixels, longest_edge: max_pixels}
    request_keys = ("min_pixels", "max_pixels", "size")
    budget_attributes = {"min_pixels": "min_pixels", "max_pixels": "max_pixels"}

    def __init__(self, family: str, pre: Mapping[str, Any], config: Mapping[str, Any],
                 budget: VisionBudget) -> None:
        where = "preprocessor_config.json"
        self.family = family
        self.grid_name = FAMILIES[family].grid_input
        self.patch_size = config_int(pre, "patch_size", 14, where)
        self.merge_size = config_int(pre, "merge_size", 2, where)
        self.temporal_patch_size = config_int(pre, "temporal_patch_size", 2, where)
        vision = config.get("vision_config") or {}
        for key, vision_key in (("patch_size", "patch_size"), ("merge_size", "spatial_merge_size"),
                                ("temporal_patch_size", "temporal_patch_size")):
            if vision_key in vision and vision[vision_key] != getattr(self, key):
                raise ModelLoadError(f"{where}: {key} {getattr(self, key)} differs from config.json "
                                     f"vision_config.{vision_key} {vision[vision_key]}")
        size = pre.get("size") if isinstance(pre.get("size"), Mapping) else {}
        # min_pixels/max_pixels win over size{shortest_edge,longest_edge}, as in transformers.
        self.min_pixels = _first(budget.min_pixels, pre.get("min_pixels"), size.get("shortest_edge"),
                                 self.default_min_pixels)
        self.max_pixels = _first(budget.max_pixels, pre.get("max_pixels"), size.get("longest_edge"),
                                 self.default_max_pixels)
        if self.min_pixels > self.max_pixels:
            raise ConfigError(f"[vision] min_pixels {self.min_pixels} > max_pixels {self.max_pixels} "
                              "(the budget and preprocessor_config.json together)")
        self.do_resize = bool(pre.get("do_resize", True))
        self.resample = resample_filter(pre.get("resample"), _BICUBIC, where)
        self.lut = channel_lut(pre, CLIP_MEAN, CLIP_STD, where)

    def _budget_values(self, kwargs: Mapping[str, Any], where: str) -> dict[str, Any]:
        size = kwargs.get("size")
        if size is None:
            size = {}
        if not isinstance(size, Mapping) or set(size) - {"shortest_edge", "longest_edge"}:
            raise InvalidInputError(f"{where}.size must be {{'shortest_edge': min_pixels, 'longest_edge': "
                                    f"max_pixels}}, got {size!r}"[:300])
        # min_pixels / max_pixels win over size, as in transformers
        return {"min_pixels": kwargs.get("min_pixels", size.get("shortest_edge")),
                "max_pixels": kwargs.get("max_pixels", size.get("longest_edge"))}

    def _check_budget(self, values: Mapping[str, Any], where: str) -> None:
        if values["min_pixels"] > values["max_pixels"]:
            raise InvalidInputError(f"{where}: min_pixels {values['min_pixels']} > max_pixels {values['max_pixels']} "
                                    "(the request's image budget over the model's)")
        if values["max_pixels"] > self.max_pixels:
            raise InvalidInputError(f"{where}: max_pixels {values['max_pixels']} is over this model's image budget of "
                                    f"{self.max_pixels} pixels (its [vision] max_pixels caps a request's)")

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def resized_size(self, width: int, height: int, where: str = "image") -> tuple[int, int]:
        """(width, height) an image of this size is resized to."""
        if not self.do_resize:
            if height % self.factor or width % self.factor:
                raise InvalidInputError(f"{where}: expected sides that are multiples of {self.factor} "
                                        f"(do_resize is off), got {width}x{height}")
            return width, height
        resized_h, resized_w = self.smart_resize(height, width, where)
        return resized_w, resized_h

    def smart_resize(self, height: int, width: int, where: str) -> tuple[int, int]:
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels, where)

    def num_tokens(self, width: int, height: int) -> int:
        """Image tokens an image of this size costs (without decoding it)."""
        resized_w, resized_h = self.resized_size(width, height)
        return (resized_h // self.patch_size) * (resized_w // self.patch_size) // self.merge_size ** 2

    def prompt_text(self, width: int, height: int) -> str:
        return self.placeholder * self.num_tokens(width, height)

    def process(self, image: Image.Image, where: str = "image") -> ProcessedImage:
        image = rgb(image)
        width, height = self.resized_size(*image.size, where=where)
        if (width, height) != image.size:
            image = image.resize((width, height), resample=self.resample)
        chw = normalized_chw(np.asarray(image), self.lut)
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        grid_h, grid_w = height // p, width // p
        # [C, gh/m, m, p, gw/m, m, p] -> [gh/m, gw/m, m, m, C, p, p]; the frame repeated over T
        # lands between C and the patch rows, written once by broadcasting.
        blocks = chw.reshape(3, grid_h // m, m, p, grid_w // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
        patches = np.empty((grid_h // m, grid_w // m, m, m, 3, t, p, p), dtype=np.float32)
        patches[...] = blocks[:, :, :, :, :, None]
        num_patches = grid_h * grid_w
        tokens = num_patches // m ** 2
        return ProcessedImage(
            feeds={"pixel_values": patches.reshape(num_patches, 3 * t * p * p),
                   self.grid_name: np.array([[1, grid_h, grid_w]], dtype=np.int64)},
            num_tokens=tokens, grid_thw=(1, grid_h, grid_w), prompt_text=self.placeholder * tokens)


class GlmImageProcessor(QwenImageProcessor):
    """``glm4v`` (grid feed ``image_grid_thw``): Qwen2-VL's patches, GLM's bounds and placeholder."""

    placeholder = "<|image|>"
    # Glm4vImageProcessor's default size: shortest_edge 112*112, longest_edge 28*28*15000
    default_min_pixels, default_max_pixels = 112 * 112, 28 * 28 * 15000

    def smart_resize(self, height: int, width: int, where: str) -> tuple[int, int]:
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels, where,
                            frames=self.temporal_patch_size, min_side=self.factor)


def _first(*values: Any) -> int:
    value = next(v for v in values if v is not None)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelLoadError(f"preprocessor_config.json: min/max pixels must be positive integers, got {value!r}")
    return value
