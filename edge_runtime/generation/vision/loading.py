"""Load a VLM folder's parts for ``GenerativeModel``: decoder engine, token embedder, vision encoder, prompter."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edge_runtime.generation.vision.engine import EmbeddingDecoderEngine
from edge_runtime.generation.vision.folder import VLMFolder, read_vlm_folder
from edge_runtime.generation.vision.prompt import VisionPrompter
from edge_runtime.generation.vision.settings import VisionSettings

if TYPE_CHECKING:
    from PIL import Image

    from edge_runtime.generation.chat import ChatTokenizer
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.generation.vision.encoder import VisionLoader
    from edge_runtime.generation.vision.preprocess import ImageProcessor


log = logging.getLogger(__name__)

TYPICAL_SCREENSHOT = (1080, 2400)  # (width, height): a phone's portrait screenshot
# Image tokens per screenshot above which the load warns: each costs prefill and, far more, vision
# encoder time (the encoder's attention grows with the square of the patches): ~1.3 s for 1,000
# tokens on two x86 cores in tools/bench_vlm.py's model, so Qwen2-VL's own default (3,354) is many
# seconds a step on a phone.
MANY_IMAGE_TOKENS = 2048


@dataclass(frozen=True)
class VisionParts:
    folder: VLMFolder
    engine: EmbeddingDecoderEngine
    prompter: VisionPrompter


def load_vision_parts(path: Path, settings: "GenerationSettings", vision: VisionSettings | None,
                      tokenizer: "ChatTokenizer", *, threads: int,
                      loader: "VisionLoader | None" = None, cache_dir: Path | None = None) -> VisionParts:
    """Read the folder and load its three graphs; the vision encoder through ``loader`` (``Runtime.load``
    with ``vision.plan``) when given; a decoder quantized with per-call int8 activation scales
    (transformers.js' q8) served per token (``per_token_exports``; its rewrite kept under ``cache_dir``,
    default the runtime's) unless ``settings.fuse_exports`` is off. Raises ModelLoadError /
    ModelNotFoundError."""
    from edge_runtime.generation.footprint import kv_positions
    from edge_runtime.generation.vision.embeddings import TokenEmbedder
    from edge_runtime.generation.vision.encoder import VisionEncoder
    from edge_runtime.generation.vision.feature_cache import ImageFeatureCache
    from edge_runtime.generation.vision.preprocess import image_processor

    vision = vision or VisionSettings()
    vlm = read_vlm_folder(path, vision)
    if settings.fuse_exports:
        vlm = _per_token_decoder(vlm, cache_dir)
    processor = image_processor(vlm.path, vlm.config, vision.budget)
    _report_budget(path, processor)
    embedder = TokenEmbedder(vlm.embed_path, vlm.embeds_dtype, threads=threads)
    engine = EmbeddingDecoderEngine(vlm, embedder, threads=threads, max_batch=settings.max_batch_size,
                                    flush_denormals=settings.flush_denormals,
                                    max_len=kv_positions(vlm.decoder, settings))
    typical = processor.process(typical_screenshot(), "typical image").feeds if loader is not None else None
    encoder = VisionEncoder(vlm.vision_path, vlm.hidden_size, loader=loader, plan=vision.plan, typical=typical,
                            threads=threads)
    prompter = VisionPrompter(vlm, tokenizer, processor, encoder, embedder, vision.access, vision.max_images,
                              ImageFeatureCache(vision.feature_cache_bytes), max_tokens=engine.kv.max_len)
    return VisionParts(vlm, engine, prompter)


def _per_token_decoder(vlm: VLMFolder, cache_dir: Path | None) -> VLMFolder:
    """``vlm`` with its decoder's per-token rewrite where it has per-call int8 activation scales."""
    import dataclasses

    from edge_runtime.config import default_cache_dir
    from edge_runtime.generation.per_token_exports import per_token_graph

    served, why = per_token_graph(vlm.decoder.model_path, cache_dir or default_cache_dir())
    if served == vlm.decoder.model_path:
        return vlm
    log.info("%s: decoder %s: %s", vlm.path.name, vlm.decoder.model_path.name, why)
    return dataclasses.replace(vlm, decoder=dataclasses.replace(vlm.decoder, model_path=served))


def _report_budget(path: Path, processor: "ImageProcessor") -> None:
    """Say what a phone screenshot costs under the model's image budget (a warning when it is many
    tokens: the budget is the main speed control, and the preprocessor's default is rarely right
    for a phone)."""
    tokens = processor.num_tokens(*TYPICAL_SCREENSHOT)
    many = tokens > MANY_IMAGE_TOKENS
    log.log(logging.WARNING if many else logging.INFO,
            "%s: a %dx%d screenshot is %d image tokens under this image budget%s", path.name, *TYPICAL_SCREENSHOT,
            tokens, "; each costs vision-encoder and prefill time: lower [vision] max_pixels (Qwen) or "
            "longest_edge (SmolVLM) for phone-speed steps" if many else "")


def typical_screenshot() -> "Image.Image":
    """A blank phone screenshot (1080x2400): preprocessed under the model's budget, its feeds have the
    shapes a planner should cost the vision encoder at."""
    from PIL import Image

    return Image.new("RGB", TYPICAL_SCREENSHOT, (128, 128, 128))
