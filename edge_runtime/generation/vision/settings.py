"""``[vision]``: the engine's per-model settings of a vision-language model (``<repo>/<model>/config.toml``).

::

    [vision]
    precision = "fp32"            # one precision for every part, or per part:
    # precision = {decoder = "q4", vision_encoder = "fp16", embed_tokens = "fp32"}
                                  # fp32 fp16 q8 int8 uint8 q4 q4f16 bnb4 (transformers.js' file suffixes);
                                  # a part left out: the first file present in PRECISION_ORDER
    plan = "auto"                 # where the vision encoder runs: cpu, gpu, hybrid, auto (Runtime.load's plans)
    max_images = 8                # images in one request at most
    feature_cache_bytes = 67108864  # encoder output of recent images, reused when one is sent again (0 = off)

The same table holds the image budget (``max_pixels``, ``min_pixels``,
``longest_edge``, ``split_image``: ``preprocess.VisionBudget``) and what image
sources may be read (``allowed_domains``, ``allowed_local_paths``,
``max_image_bytes``, ``max_image_pixels``, ``fetch_timeout_s``:
``images.ImageAccess``); ``vision_settings`` reads all three.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from edge_runtime.errors import ConfigError
from edge_runtime.generation.folder import SUFFIXES
from edge_runtime.generation.vision.images import ImageAccess
from edge_runtime.generation.vision.preprocess import VisionBudget

PARTS = ("decoder", "embed_tokens", "vision_encoder")
PLANS = ("cpu", "gpu", "hybrid", "auto")


@dataclass(frozen=True)
class VisionSettings:
    precision: str | Mapping[str, str] = field(default_factory=dict)
    plan: str = "auto"
    max_images: int = 8
    feature_cache_bytes: int = 64 * 1024 * 1024
    budget: VisionBudget = field(default_factory=VisionBudget)
    access: ImageAccess = field(default_factory=ImageAccess)

    def __post_init__(self) -> None:
        table = self.precision if isinstance(self.precision, Mapping) else dict.fromkeys(PARTS, self.precision)
        unknown = sorted(set(table) - set(PARTS))
        if unknown:
            raise ConfigError(f"[vision] precision: unknown part(s) {unknown}; known: {list(PARTS)}")
        for part, name in table.items():
            if name not in SUFFIXES:
                raise ConfigError(f"[vision] precision.{part} must be one of {list(SUFFIXES)}, got {name!r}")
        object.__setattr__(self, "precision", dict(table))
        if self.plan not in PLANS:
            raise ConfigError(f"[vision] plan must be one of {list(PLANS)}, got {self.plan!r}")
        if self.max_images < 1:
            raise ConfigError(f"[vision] max_images must be >= 1, got {self.max_images}")
        if isinstance(self.feature_cache_bytes, bool) or not isinstance(self.feature_cache_bytes, int) \
                or self.feature_cache_bytes < 0:
            raise ConfigError(f"[vision] feature_cache_bytes must be an integer >= 0, got {self.feature_cache_bytes!r}")

    def precision_of(self, part: str) -> str | None:
        """The precision set for ``part``, or None (choose the first file present)."""
        return self.precision.get(part)  # type: ignore[union-attr]


ENGINE_KEYS = ("precision", "plan", "max_images", "feature_cache_bytes")


def vision_settings(extra: Mapping[str, Any], where: str) -> VisionSettings:
    """A model config's ``[vision]`` table (defaults when absent); ConfigError names the key."""
    from edge_runtime.config import from_mapping

    table = extra.get("vision", {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: [vision] must be a table")
    groups = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (VisionBudget, ImageAccess)}
    known = {*ENGINE_KEYS, *groups[VisionBudget], *groups[ImageAccess]}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}: [vision]: unknown key(s) {unknown}; known: {sorted(known)}")
    context = f"{where}: [vision]"
    parts = {cls: from_mapping(cls, {k: v for k, v in table.items() if k in names}, context)
             for cls, names in groups.items()}
    engine = from_mapping(VisionSettings, {k: v for k, v in table.items() if k in ENGINE_KEYS}, context)
    return dataclasses.replace(engine, budget=parts[VisionBudget], access=parts[ImageAccess])
