"""What a generative model holds in memory: its charge against the daemon's ``[memory]`` budget.

A served decoder is charged three parts (a vision-language model four), each under the model's name:

* ``weights``: its model files (``model.onnx`` and its external data; a vision-language model's
  decoder, embed_tokens and vision encoder files) times the budget's ``footprint_factor``, as a
  tensor model is charged;
* ``kv_cache``: the decode batch's KV buffers, which the engine allocates once at load
  (``BatchKV``: two buffers per layer tensor × rows × positions × bytes per token, where rows is
  ``max_batch_size`` — 1 for a model without ``position_ids`` — positions is the model's context
  capped by ``max_seq_len``, and a token costs 2 × layers × kv heads × head dim × dtype size);
* ``prefix_cache``: the prefix cache's cap, ``prefix_cache_bytes``: the cache fills up to it and
  keeps it, so the cap is what it may take;
* ``image_cache`` (vision-language models): the image feature cache's cap, ``[vision]
  feature_cache_bytes``, for the same reason.

``planned_footprint`` computes them from the folder and settings before anything is allocated
(the budget makes room first); ``loaded_footprint`` reads the same parts from a loaded model (its
real buffers). onnxruntime-genai folders: genai owns and sizes its own KV cache and has no prefix
cache of ours, so only their weights are charged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edge_runtime.generation.folder import DecoderFolder, is_genai_folder
from edge_runtime.generation.settings import GenerationSettings

if TYPE_CHECKING:
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.vision.settings import VisionSettings


@dataclass(frozen=True)
class GenerationFootprint:
    weights_bytes: int
    kv_cache_bytes: int
    prefix_cache_bytes: int
    image_cache_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.prefix_cache_bytes + self.image_cache_bytes

    def parts(self) -> dict[str, int]:
        parts = {"weights": self.weights_bytes, "kv_cache": self.kv_cache_bytes,
                 "prefix_cache": self.prefix_cache_bytes}
        if self.image_cache_bytes:
            parts["image_cache"] = self.image_cache_bytes
        return parts

    def describe(self) -> str:
        """``weights W + KV cache K + prefix cache P [+ image feature cache I] = T bytes``, for errors."""
        image = f" + image feature cache {self.image_cache_bytes}" if self.image_cache_bytes else ""
        return (f"weights {self.weights_bytes} + KV cache {self.kv_cache_bytes} + prefix cache "
                f"{self.prefix_cache_bytes}{image} = {self.total_bytes} bytes")


def kv_positions(folder: DecoderFolder, settings: GenerationSettings) -> int:
    """Positions per KV row: the model's context, capped by ``[generation] max_seq_len``."""
    return min(folder.context_length, settings.max_seq_len)


def planned_footprint(path: Path, settings: GenerationSettings, footprint_factor: float,
                      vision: "VisionSettings | None" = None, cache_dir: Path | None = None) -> GenerationFootprint:
    """The parts a load of the folder ``path`` will allocate (reads its description, allocates nothing).

    A vision-language folder's weights are its three parts' files as ``vision`` (its ``[vision]``
    settings) chooses them. An optimum export is described as its load will run it
    (``fused_exports.text_decoder``: rebuilt into ``cache_dir`` now if it is not yet). Raises what
    reading the folder raises (ModelLoadError, ModelNotFoundError).
    """
    from edge_runtime.generation.engine import decode_rows, kv_buffer_bytes

    from edge_runtime.generation.folder import engine_genai_decoder
    from edge_runtime.generation.fused_exports import text_decoder
    from edge_runtime.generation.vision.folder import is_vlm_folder, read_vlm_folder

    own = None  # a genai folder our engine runs (GenerativeModel decides the same way)
    if is_genai_folder(path):
        own = engine_genai_decoder(path, settings.genai_runtime)[0]
        if own is None:
            from edge_runtime.generation.genai_engine import read_genai_folder

            return GenerationFootprint(int(read_genai_folder(path).weight_bytes * footprint_factor), 0, 0)
    image_cache = 0
    if own is not None:
        folder = own
    elif is_vlm_folder(path):
        from edge_runtime.generation.vision.settings import VisionSettings

        folder = read_vlm_folder(path, vision).decoder
        image_cache = (vision or VisionSettings()).feature_cache_bytes
    else:
        folder = text_decoder(path, settings, cache_dir)[0]
    kv = kv_buffer_bytes(folder, decode_rows(folder, settings.max_batch_size), kv_positions(folder, settings))
    return GenerationFootprint(int(folder.weight_bytes * footprint_factor), kv, settings.prefix_cache_bytes,
                               image_cache)


def loaded_footprint(model: "GenerativeModel", footprint_factor: float) -> GenerationFootprint:
    """The same parts, read from a loaded model: its KV buffers as allocated, its caches' caps."""
    features = getattr(model.prompter, "features", None)
    return GenerationFootprint(int(model.folder.weight_bytes * footprint_factor), model.kv_cache_bytes,
                               model.prefix_cache.budget_bytes, features.budget_bytes if features is not None else 0)
