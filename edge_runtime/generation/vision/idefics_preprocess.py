"""Idefics3 / SmolVLM preprocessing, equal to transformers' ``Idefics3ImageProcessor`` /
``SmolVLMImageProcessor`` (slow path; the two are the same code) and the prompt their processors write.

One image is resized so its longest edge is ``size.longest_edge`` (the budget's
``longest_edge``); with splitting on, resized again to multiples of the encoder's tile
(``max_image_size.longest_edge``), cut into rows x cols tiles, and followed by the whole
image resized to one tile (the global image); with splitting off, just that one tile.
Each tile yields ``image_seq_len`` features; the prompt gives each tile
``<fake_token_around_image><row_r_col_c>`` + ``<image>`` x image_seq_len, a newline after each
row, then ``\\n<fake_token_around_image><global-img>`` + ``<image>`` x image_seq_len +
``<fake_token_around_image>``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from edge_runtime.errors import InvalidInputError, ModelLoadError
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

STANDARD_MEAN = (0.5, 0.5, 0.5)
STANDARD_STD = (0.5, 0.5, 0.5)
MAX_IMAGE_SIDE = 4096  # transformers' absolute cap on the first resize
_LANCZOS = 1

FAKE_TOKEN = "<fake_token_around_image>"
IMAGE_TOKEN = "<image>"
GLOBAL_TOKEN = "<global-img>"


def first_resize(height: int, width: int, longest_edge: int) -> tuple[int, int]:
    """(height, width) after the longest-edge resize (the other side kept even), capped at 4096."""
    aspect = width / height
    if width >= height:
        width = longest_edge
        height = int(width / aspect)
        height += height % 2
    else:
        height = longest_edge
        width = int(height * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIDE:
        width = MAX_IMAGE_SIDE
        height = int(width / aspect)
    elif height > width and height > MAX_IMAGE_SIDE:
        height = MAX_IMAGE_SIDE
        width = int(height * aspect)
    return max(height, 1), max(width, 1)


def tiled_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """(height, width) resized to multiples of ``tile``, keeping the aspect as transformers rounds it."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def image_prompt(rows: int, cols: int, image_seq_len: int) -> str:
    """The text Idefics3Processor/SmolVLMProcessor put in place of one ``<image>``."""
    image_run = IMAGE_TOKEN * image_seq_len
    global_part = f"{FAKE_TOKEN}{GLOBAL_TOKEN}{image_run}{FAKE_TOKEN}"
    if rows == 0 and cols == 0:
        return global_part
    lines = ["".join(f"{FAKE_TOKEN}<row_{r + 1}_col_{c + 1}>{image_run}" for c in range(cols)) + "\n"
             for r in range(rows)]
    return "".join(lines) + "\n" + global_part


class IdeficsImageProcessor(ImageProcessor):
    """``idefics3`` and ``smolvlm``: feeds ``pixel_values`` [1, tiles, 3, S, S] and
    ``pixel_attention_mask`` [1, tiles, S, S] (bool)."""

    placeholder = IMAGE_TOKEN
    # transformers' Idefics3ImageProcessor arguments, and [vision]'s names for the same two settings
    request_keys = ("size", "do_image_splitting", "longest_edge", "split_image")
    budget_attributes = {"longest_edge": "longest_edge", "split_image": "split"}

    def __init__(self, family: str, pre: Mapping[str, Any], config: Mapping[str, Any],
                 budget: VisionBudget, processor_config: Mapping[str, Any] | None = None) -> None:
        where = "preprocessor_config.json"
        self.family = family
        size = _edge(pre.get("size"), 4 * 364, "size", where)
        self.longest_edge = budget.longest_edge if budget.longest_edge is not None else size
        self.tile = _edge(pre.get("max_image_size"), 364, "max_image_size", where)
        self.split = (budget.split_image if budget.split_image is not None
                      else bool(pre.get("do_image_splitting", True)))
        self.do_resize = bool(pre.get("do_resize", True))
        self.resample = resample_filter(pre.get("resample"), _LANCZOS, where)
        self.lut = channel_lut(pre, STANDARD_MEAN, STANDARD_STD, where)
        self.image_seq_len = _image_seq_len(config, processor_config or {}, self.tile)

    def _budget_values(self, kwargs: Mapping[str, Any], where: str) -> dict[str, Any]:
        size = kwargs.get("size")
        if size is not None and (not isinstance(size, Mapping) or set(size) != {"longest_edge"}):
            raise InvalidInputError(f"{where}.size must be {{'longest_edge': int}}, got {size!r}"[:300])
        return {"longest_edge": kwargs.get("longest_edge", size["longest_edge"] if size else None),
                "split_image": kwargs.get("split_image", kwargs.get("do_image_splitting"))}

    def _check_budget(self, values: Mapping[str, Any], where: str) -> None:
        if values["longest_edge"] > self.longest_edge:
            raise InvalidInputError(f"{where}: longest_edge {values['longest_edge']} is over this model's image "
                                    f"budget of {self.longest_edge} pixels (its [vision] longest_edge caps a request's)")
        if values["split"] and not self.split:
            raise InvalidInputError(f"{where}: image splitting is off in this model's image budget (its [vision] "
                                    "split_image caps a request's)")

    def layout(self, width: int, height: int) -> tuple[tuple[int, int], tuple[int, int] | None, int, int]:
        """(first-resize (w, h), tiled (w, h) or None, rows, cols) for an image of this size."""
        if self.do_resize:
            height, width = first_resize(height, width, self.longest_edge)
        if not self.split:
            return (width, height), None, 0, 0
        tiled_h, tiled_w = tiled_size(height, width, self.tile)
        if tiled_h > self.tile or tiled_w > self.tile:
            return (width, height), (tiled_w, tiled_h), tiled_h // self.tile, tiled_w // self.tile
        return (width, height), (tiled_w, tiled_h), 0, 0

    def num_tokens(self, width: int, height: int) -> int:
        """Image tokens an image of this size costs (without decoding it)."""
        _, _, rows, cols = self.layout(width, height)
        return self.image_seq_len * (rows * cols + 1)

    def prompt_text(self, width: int, height: int) -> str:
        _, _, rows, cols = self.layout(width, height)
        return image_prompt(rows, cols, self.image_seq_len)

    def process(self, image: Image.Image, where: str = "image") -> ProcessedImage:
        image, tile = rgb(image), self.tile
        first, tiled, rows, cols = self.layout(*image.size)
        if self.do_resize:
            # transformers resizes even to the same size; PIL then returns an exact copy, so skip it.
            image = _resize(image, first, self.resample)
        if tiled is None:
            frames = [np.asarray(_resize(image, (tile, tile), self.resample))]
        else:
            image = _resize(image, tiled, self.resample)
            whole = np.asarray(image)
            frames = [whole[r * tile:(r + 1) * tile, c * tile:(c + 1) * tile]
                      for r in range(rows) for c in range(cols)]
            frames.append(np.asarray(_resize(image, (tile, tile), self.resample)) if frames else whole)
        pixels = np.empty((1, len(frames), 3, tile, tile), dtype=np.float32)
        for index, frame in enumerate(frames):
            normalized_chw(frame, self.lut, out=pixels[0, index])
        mask = np.ones((1, len(frames), tile, tile), dtype=bool)
        return ProcessedImage(feeds={"pixel_values": pixels, "pixel_attention_mask": mask},
                              num_tokens=self.image_seq_len * len(frames), grid_thw=None,
                              prompt_text=image_prompt(rows, cols, self.image_seq_len))


def _resize(image: Image.Image, size: tuple[int, int], resample: int) -> Image.Image:
    return image if image.size == size else image.resize(size, resample=resample)


def _edge(value: Any, default: int, key: str, where: str) -> int:
    if value is None:
        return default
    edge = value.get("longest_edge") if isinstance(value, Mapping) else None
    if isinstance(edge, bool) or not isinstance(edge, int) or edge < 1:
        raise ModelLoadError(f"{where}: {key} must be {{\"longest_edge\": <positive int>}}, got {value!r}")
    return edge


def _image_seq_len(config: Mapping[str, Any], processor_config: Mapping[str, Any], tile: int) -> int:
    """Features per tile: (image_size // patch_size)² / scale_factor², from config.json (what the
    graphs yield), checked against processor_config.json's ``image_seq_len`` when both exist."""
    vision = config.get("vision_config") or {}
    declared = processor_config.get("image_seq_len")
    if "image_size" in vision and "patch_size" in vision:
        if vision["image_size"] != tile:
            raise ModelLoadError(f"preprocessor_config.json: max_image_size.longest_edge {tile} differs from "
                                 f"config.json vision_config.image_size {vision['image_size']}")
        scale = config.get("scale_factor", 2)
        computed = int(((vision["image_size"] // vision["patch_size"]) ** 2) / (scale ** 2))
        if declared is not None and declared != computed:
            raise ModelLoadError(f"processor_config.json: image_seq_len {declared} differs from {computed} "
                                 "computed from config.json (vision image_size, patch_size, scale_factor)")
        return computed
    if declared is None:
        raise ModelLoadError("config.json: expected vision_config.image_size and patch_size (or "
                             "processor_config.json image_seq_len) to size the image tokens")
    return config_int(processor_config, "image_seq_len", 0, "processor_config.json")
