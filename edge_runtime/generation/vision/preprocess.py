"""Per-family image preprocessing: one RGB image -> vision encoder feeds + the prompt text it stands for.

The rules come from the model folder's ``preprocessor_config.json`` (and ``config.json`` for
sizes the graphs fix), with :class:`VisionBudget` (``[vision]`` in the model's config.toml)
overriding the image budget. The result equals transformers' (slow, PIL) image processors:
the same PIL resampling, then rescale and normalise through a per-channel lookup table that
does transformers' float arithmetic on each of the 256 byte values, so ``pixel_values`` are
bit-equal, at the cost of one gather per channel.

Families: ``qwen2_vl`` / ``qwen2_5_vl`` / ``qwen3_vl`` / ``glm4v`` (:mod:`.qwen_preprocess`), ``idefics3`` /
``smolvlm`` (:mod:`.idefics_preprocess`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from edge_runtime.errors import ConfigError, InvalidInputError, ModelLoadError

if TYPE_CHECKING:
    import os

    from PIL import Image

    from edge_runtime.generation.vision.feature_cache import ImageFeatureCache
    from edge_runtime.generation.vision.images import ImageAccess

# transformers writes PILImageResampling as its int value; names are accepted too.
_RESAMPLE_NAMES = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}


@dataclass(frozen=True)
class VisionBudget:
    """The image budget of ``[vision]`` in config.toml; ``None`` keeps preprocessor_config.json's value.

    ``min_pixels`` / ``max_pixels``: the Qwen family's resize bounds (pixels of the resized image).
    ``longest_edge`` / ``split_image``: Idefics3/SmolVLM's resize target and tiling switch.
    """

    min_pixels: int | None = None
    max_pixels: int | None = None
    longest_edge: int | None = None
    split_image: bool | None = None

    def __post_init__(self) -> None:
        for key in ("min_pixels", "max_pixels", "longest_edge"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"[vision] {key} must be a positive integer, got {value!r}")
        if self.min_pixels is not None and self.max_pixels is not None and self.min_pixels > self.max_pixels:
            raise ConfigError(f"[vision] min_pixels ({self.min_pixels}) must be <= max_pixels ({self.max_pixels})")
        if self.split_image is not None and not isinstance(self.split_image, bool):
            raise ConfigError(f"[vision] split_image must be true or false, got {self.split_image!r}")

    def over(self, base: "VisionBudget") -> "VisionBudget":
        """This budget's values, ``base``'s where this one leaves a value None."""
        return VisionBudget(*(getattr(self, f.name) if getattr(self, f.name) is not None else getattr(base, f.name)
                              for f in dataclasses.fields(self)))


@dataclass(frozen=True)
class ProcessedImage:
    """One image ready for the vision encoder.

    ``feeds``: the vision_encoder inputs for this image alone, keyed by graph input name.
    ``num_tokens``: rows of ``image_features`` it yields == image tokens in ``prompt_text``.
    ``grid_thw``: Qwen's (t, h, w) in patches, else None. ``prompt_text``: what replaces this
    image's placeholder in the rendered prompt.
    """

    feeds: dict[str, np.ndarray]
    num_tokens: int
    grid_thw: tuple[int, int, int] | None
    prompt_text: str


class ImageProcessor:
    """Base of the per-family processors: ``process`` one image, ``expand`` a rendered prompt.

    A request may set its own image budget (vLLM's ``mm_processor_kwargs``, Qwen's per-image
    ``min_pixels`` / ``max_pixels``) within the model's: ``request_budget`` reads it, ``with_budget``
    gives the processor under it, whose ``tag`` keeps its images apart in the feature and prefix
    caches (the same pixels under two budgets are two different sets of image tokens).
    """

    family: str
    placeholder: str  # what the chat template writes for one image
    tag: bytes = b""  # empty for the model's own budget; else names the budget a request chose
    request_keys: tuple[str, ...] = ()  # what a request may set (``request_budget``)

    def request_budget(self, kwargs: Mapping[str, Any], where: str) -> VisionBudget:
        """A request's image processor arguments as a budget; InvalidInputError (naming ``where`` and the
        key) for a key this family does not take or a bad value."""
        if not isinstance(kwargs, Mapping):
            raise InvalidInputError(f"{where} must be an object of image processor arguments, got {kwargs!r}"[:300])
        unknown = sorted(str(key) for key in kwargs if key not in self.request_keys)
        if unknown:
            raise InvalidInputError(f"{where}: unknown image processor argument(s) {unknown} for {self.family}; "
                                    f"known: {list(self.request_keys)}")
        values = self._budget_values(kwargs, where)
        try:
            return VisionBudget(**values)
        except ConfigError as exc:
            raise InvalidInputError(f"{where}: {str(exc).removeprefix('[vision] ')}") from None

    def _budget_values(self, kwargs: Mapping[str, Any], where: str) -> dict[str, Any]:
        raise NotImplementedError

    # which attribute of the processor each budget field sets (the family's own)
    budget_attributes: Mapping[str, str] = {}

    def with_budget(self, budget: VisionBudget, where: str = "image") -> "ImageProcessor":
        """This processor under ``budget`` (None fields keep this one's values); ``self`` when nothing
        changes, so equal budgets share cache entries. InvalidInputError when the bounds cross."""
        values = {attribute: getattr(budget, key) if getattr(budget, key) is not None else getattr(self, attribute)
                  for key, attribute in self.budget_attributes.items()}
        if all(getattr(self, attribute) == value for attribute, value in values.items()):
            return self
        self._check_budget(values, where)
        variant = copy.copy(self)  # the same tables; only the budget's settings differ
        for attribute, value in values.items():
            setattr(variant, attribute, value)
        variant.tag = " ".join(f"{attribute}={value}" for attribute, value in values.items()).encode()
        return variant

    def _check_budget(self, values: Mapping[str, Any], where: str) -> None:
        """InvalidInputError when a request's budget over the model's cannot be used: bounds that cross, or
        more than the model's own budget allows (the operator's budget is the ceiling of a request's)."""

    def process(self, image: Image.Image, where: str = "image") -> ProcessedImage:
        """Feeds and prompt text for one RGB image; InvalidInputError (starting with ``where``) if unusable."""
        raise NotImplementedError

    def num_tokens(self, width: int, height: int) -> int:
        """Image tokens an image of this size costs (without decoding it)."""
        raise NotImplementedError

    def prompt_text(self, width: int, height: int) -> str:
        """What replaces the placeholder of an image of this size (``ProcessedImage.prompt_text``,
        without decoding it)."""
        raise NotImplementedError

    def expand(self, text: str, images: Sequence[ProcessedImage], where: str = "prompt") -> str:
        """Replace the placeholders of ``text``, in order, with each image's ``prompt_text``.

        Raises InvalidInputError when the number of placeholders differs from ``len(images)``.
        """
        # Split, not str.replace: an image's prompt text contains the placeholder itself.
        parts = text.split(self.placeholder)
        if len(parts) - 1 != len(images):
            raise InvalidInputError(f"{where}: the prompt has {len(parts) - 1} image placeholder(s) "
                                    f"{self.placeholder!r} but {len(images)} image(s) were given")
        return join_prompt(parts, [image.prompt_text for image in images])


def join_prompt(parts: Sequence[str], image_texts: Sequence[str]) -> str:
    """``parts`` (a rendered prompt split at its image placeholders) with each image's text between."""
    out = [parts[0]]
    for image_text, part in zip(image_texts, parts[1:]):
        out.append(image_text)
        out.append(part)
    return "".join(out)


@dataclass(frozen=True)
class PreparedImage:
    """An input decoded and preprocessed, with its content digest and the two times taken.

    ``features``: its encoder output when ``ImageFeatureCache`` had it (``processed`` then has no feeds).
    """

    processed: ProcessedImage
    digest: bytes
    decode_s: float
    preprocess_s: float
    features: np.ndarray | None = None


def prepare_image(source: Image.Image | bytes | str | os.PathLike, where: str, access: ImageAccess,
                  processor: ImageProcessor, cache: ImageFeatureCache | None = None,
                  max_tokens: int | None = None) -> PreparedImage:
    """Decode (``images.load_image``), hash and preprocess one image input, timing each part.

    For the engine's metrics (image decode + preprocess histogram) and prefix-cache keys. An image
    found in ``cache`` is not preprocessed: it comes with its features. InvalidInputError, before any
    resizing, for an image of more than ``max_tokens`` image tokens (the model's context).
    """
    from edge_runtime.generation.vision.images import image_digest, load_image

    start = time.perf_counter()
    image = load_image(source, where, access)
    digest = tagged_digest(image_digest(image), processor.tag)
    decoded = time.perf_counter()
    hit = cache.get(digest) if cache is not None else None
    if hit is not None:
        return PreparedImage(hit.processed, digest, decoded - start, 0.0, hit.features)
    check_image_tokens(processor, image.size, where, max_tokens)
    processed = processor.process(image, where)
    return PreparedImage(processed, digest, decoded - start, time.perf_counter() - decoded)


def check_image_tokens(processor: ImageProcessor, size: tuple[int, int], where: str, max_tokens: int | None) -> None:
    """InvalidInputError when an image of ``size`` is more image tokens than ``max_tokens`` (the model's
    context; None: no check) — before it is resized or its prompt text written."""
    if max_tokens is None:
        return
    tokens = processor.num_tokens(*size)
    if tokens > max_tokens:
        raise InvalidInputError(f"{where}: a {size[0]}x{size[1]} image is {tokens} image tokens under its image "
                                f"budget, more than the model's context of {max_tokens} tokens: lower max_pixels "
                                "(Qwen, GLM) or longest_edge (SmolVLM)")


def tagged_digest(digest: bytes, tag: bytes) -> bytes:
    """An image's cache key under a processor: its pixel ``digest`` alone under the model's own budget,
    else mixed with the budget's ``tag`` (16 bytes either way)."""
    import hashlib

    return digest if not tag else hashlib.sha256(digest + b"|" + tag).digest()[:16]


def image_processor(folder: Path, config: Mapping[str, Any], budget: VisionBudget) -> ImageProcessor:
    """The processor for a model folder: ``config`` is its config.json, ``budget`` the [vision] overrides.

    Raises ModelLoadError for an unknown family or a missing/invalid preprocessor_config.json.
    """
    from edge_runtime.generation.vision.families import FAMILIES

    family = str(config.get("model_type", ""))
    kind = FAMILIES[family].preprocessing if family in FAMILIES else ""
    pre = read_json(Path(folder) / "preprocessor_config.json")
    if kind == "qwen":
        from edge_runtime.generation.vision.qwen_preprocess import QwenImageProcessor

        return QwenImageProcessor(family, pre, config, budget)
    if kind == "glm":
        from edge_runtime.generation.vision.qwen_preprocess import GlmImageProcessor

        return GlmImageProcessor(family, pre, config, budget)
    if kind == "idefics":
        from edge_runtime.generation.vision.idefics_preprocess import IdeficsImageProcessor

        processor_config_path = Path(folder) / "processor_config.json"
        processor_config = read_json(processor_config_path) if processor_config_path.is_file() else {}
        return IdeficsImageProcessor(family, pre, config, budget, processor_config)
    raise ModelLoadError(f"{folder}: no image preprocessing for model_type {family!r} "
                         f"(expected one of {', '.join(FAMILIES)})")


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelLoadError(f"{path}: missing (a vision model folder needs it)") from exc
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: expected a JSON object, got unreadable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def resample_filter(value: Any, default: int, where: str) -> int:
    """PIL's resampling filter from a preprocessor_config.json ``resample`` value (int or name)."""
    if value is None:
        return default
    if isinstance(value, str) and value.lower() in _RESAMPLE_NAMES:
        return _RESAMPLE_NAMES[value.lower()]
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 5:
        return value
    raise ModelLoadError(f"{where}: resample must be a PIL filter (0-5 or a name), got {value!r}")


def channel_lut(pre: Mapping[str, Any], default_mean: Sequence[float], default_std: Sequence[float],
                where: str) -> np.ndarray:
    """[3, 256] float32: each byte value rescaled and normalised per channel, as transformers does.

    transformers rescales as ``float32(uint8 as float64 * factor)`` and normalises as
    ``(x - mean) / std`` in float32; doing the same on the 256 values makes a gather bit-equal.
    """
    values = np.arange(256, dtype=np.float64)
    if pre.get("do_rescale", True):
        values = values * float(pre.get("rescale_factor", 1 / 255))
    lut = np.broadcast_to(values.astype(np.float32), (3, 256))
    if pre.get("do_normalize", True):
        mean, std = (_per_channel(pre.get(key), default, key, where)
                     for key, default in (("image_mean", default_mean), ("image_std", default_std)))
        if np.any(std == 0):
            raise ModelLoadError(f"{where}: image_std must be non-zero, got {std.tolist()}")
        lut = (lut - mean[:, None]) / std[:, None]
    return np.ascontiguousarray(lut, dtype=np.float32)


def rgb(image: Image.Image) -> Image.Image:
    """``image`` in RGB (``images.load_image`` already gives RGB; a caller's own PIL image may not be)."""
    return image if image.mode == "RGB" else image.convert("RGB")


def normalized_chw(rgb: np.ndarray, lut: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """uint8 [H, W, 3] -> float32 [3, H, W] through ``lut`` (into ``out`` when given)."""
    if out is None:
        out = np.empty((3,) + rgb.shape[:2], dtype=np.float32)
    for channel in range(3):
        # mode="clip": a uint8 index is always in range, and "raise" would buffer `out`.
        np.take(lut[channel], rgb[:, :, channel], out=out[channel], mode="clip")
    return out


def _per_channel(value: Any, default: Sequence[float], key: str, where: str) -> np.ndarray:
    if value is None:
        value = default
    if isinstance(value, (int, float)):
        value = [value] * 3
    try:
        array = np.asarray([float(v) for v in value], dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{where}: {key} must be 3 numbers, got {value!r}") from exc
    if array.shape != (3,):
        raise ModelLoadError(f"{where}: {key} must be 3 numbers, got {value!r}")
    return array


def config_int(mapping: Mapping[str, Any], key: str, default: int, where: str) -> int:
    """A positive integer setting of a JSON config (``default`` when absent)."""
    value = mapping.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelLoadError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value
