"""Images for onnxruntime-genai VLM folders (``genai_config.json`` with a ``model.vision`` section).

genai owns the vision model, the embedding model (which splices the image features in) and
the decoder with its M-RoPE positions; we keep what the text genai path keeps (chat
template, tokeniser, sampling) plus image input handling:

1. each image is read and decoded by ``vision.images`` (the same ``[vision]`` allow-list,
   size and pixel caps, and the same InvalidInputErrors naming the message part as our own
   VLM path), then handed to genai as lossless PNG bytes;
2. genai's ``MultiModalProcessor`` (onnxruntime-extensions, from the folder's
   ``processor_config.json``) resizes and patches them: ``pixel_values``, ``image_grid_thw``,
   ``num_image_tokens``;
3. each image placeholder of our rendered prompt is expanded to the image's token count
   (``t*h*w / merge²`` of genai's grid) and tokenised by our tokenizer, so prompt ids,
   ``usage.prompt_tokens`` and stop handling mean the same as on every other engine;
   those ids replace the processor's own ``input_ids`` in the named tensors the generator takes.

Families: genai's Qwen-VL types (``qwen2_5_vl``, ``qwen3_vl``, ``fara``...), whose prompts mark
each image as ``<|vision_start|><|image_pad|><|vision_end|>``; other genai VLM types (``phi3v``,
``gemma3``, ``mistral3``) load as text models, with a warning. Only ``qwen2_5_vl`` is tested
(``genai_vlm_folder`` builds one). The ``[vision]`` image budget
(``max_pixels``...) does not apply: the folder's ``processor_config.json`` decides the size.
Known difference (onnxruntime-genai 0.18): its smart resize rounds a side of exactly k+0.5
patches of 28 px up where transformers rounds half to even (a 70-px side: 3 patches vs 2).
"""

from __future__ import annotations

import io
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from edge_runtime.errors import InvalidInputError, ModelLoadError

if TYPE_CHECKING:
    from edge_runtime.generation.chat import ChatTokenizer
    from edge_runtime.generation.vision.messages import ImageInput
    from edge_runtime.generation.vision.prompt import ImageTimings
    from edge_runtime.generation.vision.settings import VisionSettings

log = logging.getLogger(__name__)

# genai 0.18's ModelType::IsQwenVLFamily: 3-D M-RoPE positions, <|vision_start|>-marked images
QWEN_VL_TYPES = ("qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe", "fara")
VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"


def genai_vision_section(config: dict[str, Any]) -> dict[str, Any] | None:
    """The ``model.vision`` section of a parsed ``genai_config.json``, or None (a text model)."""
    vision = (config.get("model") or {}).get("vision")
    return vision if isinstance(vision, dict) and vision.get("filename") else None


@dataclass(frozen=True)
class GenaiPrompt:
    """What ``GenaiVisionPrompter.build`` gives ``GenerativeModel.prepare`` (the fields of
    ``vision.prompt.VisionPrompt``): ``inputs`` are genai's named tensors for ``set_inputs``."""

    ids: list[int]
    text: str
    inputs: Any  # og.NamedTensors
    cache_key: None
    timings: "ImageTimings"


class _NoEncoder:
    """genai runs the vision model inside its generator: nothing of ours to close."""

    def close(self) -> None:
        pass


class GenaiVisionPrompter:
    """Prepares image requests for one genai VLM; ``build`` runs on the caller's thread."""

    def __init__(self, og: Any, model: Any, model_type: str, tokenizer: "ChatTokenizer", spatial_merge_size: int,
                 vision: "VisionSettings | None" = None) -> None:
        from edge_runtime.generation.vision.settings import VisionSettings

        if model_type not in QWEN_VL_TYPES:
            raise ModelLoadError(f"onnxruntime-genai VLM type {model_type!r} is not supported here: images are "
                                 f"handled for {list(QWEN_VL_TYPES)}")
        for token in (VISION_START, IMAGE_PAD, VISION_END):
            if tokenizer.tokenizer.token_to_id(token) is None:
                raise ModelLoadError(f"{model_type} folder: the tokenizer has no {token} token")
        vision = vision or VisionSettings()
        self._og = og
        self._processor = model.create_multimodal_processor()
        self._lock = threading.Lock()  # one processor, callers on many threads
        self.tokenizer = tokenizer
        self.merge = spatial_merge_size
        self.access = vision.access
        self.max_images = vision.max_images
        self.placeholder = IMAGE_PAD
        self.image_marker = VISION_START + IMAGE_PAD + VISION_END  # one image in a plain prompt
        self.encoder = _NoEncoder()

    def warm_up(self) -> float:
        """Run the processor on one small blank image; returns the milliseconds it took."""
        from PIL import Image

        started = time.perf_counter()
        self._process([Image.new("RGB", (56, 56), (128, 128, 128))])
        return (time.perf_counter() - started) * 1e3

    def _process(self, images: Sequence[Any]) -> Any:
        blobs = []
        for image in images:
            buffer = io.BytesIO()
            image.save(buffer, format="PNG", compress_level=1)  # lossless: genai sees our decoded pixels
            blobs.append(buffer.getvalue())
        with self._lock:
            return self._processor(self.image_marker * len(images), images=self._og.Images.open_bytes(*blobs))

    def build(self, text: str, images: Sequence["ImageInput"], *, add_special_tokens: bool) -> GenaiPrompt:
        """genai's inputs for ``text`` (rendered by the chat template, or a plain prompt) with
        ``images``; a plain prompt without placeholders gets one image marker per image in front.
        InvalidInputError: too many images, a bad image (naming its part), placeholders and
        images that do not pair up."""
        from edge_runtime.generation.vision.images import image_from_url, load_image
        from edge_runtime.generation.vision.prompt import ImageTimings

        if len(images) > self.max_images:
            raise InvalidInputError(f"At most {self.max_images} image(s) may be provided in one prompt.")
        budgeted = next((where for image in images for where, _ in image.overrides), None)
        if budgeted is not None:  # genai's processor reads its own config only
            raise InvalidInputError(f"{budgeted}: an image budget per request is not supported by onnxruntime-genai "
                                    "folders (genai's processor config decides)")
        if add_special_tokens and IMAGE_PAD not in text:
            text = self.image_marker * len(images) + text
        placeholders = text.count(IMAGE_PAD)
        if placeholders != len(images) or text.count(VISION_START) != len(images):
            raise InvalidInputError(f"the prompt has {placeholders} image placeholder(s) {IMAGE_PAD!r} "
                                    f"({text.count(VISION_START)} {VISION_START!r}) but {len(images)} image(s) "
                                    "were given")
        started = time.perf_counter()
        decoded = [load_image(image_from_url(i.source, i.where, self.access) if i.is_url else i.source, i.where,
                              self.access) for i in images]
        processed = time.perf_counter()
        try:
            inputs = self._process(decoded)
        except RuntimeError as exc:  # the processor's own refusals (e.g. an image under one patch)
            raise InvalidInputError(f"onnxruntime-genai's image processor refused the image(s): {exc}") from None
        grids = np.asarray(inputs["image_grid_thw"].as_numpy(), np.int64).reshape(-1, 3)
        counts = [int(t * h * w) // self.merge ** 2 for t, h, w in grids]
        if len(counts) != len(images):
            raise InvalidInputError(f"onnxruntime-genai's processor gave {len(counts)} image grid(s) for "
                                    f"{len(images)} image(s)")
        pieces = text.split(IMAGE_PAD)
        expanded = pieces[0] + "".join(IMAGE_PAD * n + rest for n, rest in zip(counts, pieces[1:]))
        ids = self.tokenizer.tokenizer.encode(expanded, add_special_tokens=add_special_tokens).ids
        inputs["input_ids"] = np.asarray([ids], np.int32)  # ours, not the processor's tokenisation
        done = time.perf_counter()
        # genai encodes the images inside its prefill: no encode time here
        timings = ImageTimings(len(images), sum(counts), (processed - started) * 1e3, (done - processed) * 1e3, 0.0)
        return GenaiPrompt(ids, expanded, inputs, None, timings)


def genai_prompter(batcher: Any, model_type: str, tokenizer: "ChatTokenizer",
                   vision: "VisionSettings | None") -> GenaiVisionPrompter | None:
    """The prompter of a genai VLM folder (``batcher``: its ``GenaiBatcher``), None for a text folder
    and for a VLM type whose prompts we cannot build (it then serves text only, and says so)."""
    if batcher.vision is None:
        return None
    if model_type not in QWEN_VL_TYPES:
        log.warning("onnxruntime-genai VLM type %r: images are handled for %s only; serving it as a text model",
                    model_type, list(QWEN_VL_TYPES))
        return None
    return GenaiVisionPrompter(batcher.og, batcher.model, model_type, tokenizer,
                               int(batcher.vision.get("spatial_merge_size", 2)), vision)
