"""A prompt with images → the decoder inputs of one sequence, built before it is queued.

``VisionPrompter.build`` runs on the caller's thread (the HTTP side calls it
through ``asyncio.to_thread``), so decoding, preprocessing and encoding a
screenshot never run on the batcher's thread and never stall running streams:

1. decode and preprocess each image (``preprocess.prepare_image``: RGB, the
   encoder's feeds, the image's token count and content digest), unless the
   ``ImageFeatureCache`` holds that content already;
2. expand each image placeholder of the rendered text into the image's tokens
   and tokenise;
3. encode each image not found in the cache (``VisionEncoder``; then kept in
   the cache), embed the prompt's tokens
   (``TokenEmbedder``) and splice the features in at the image tokens;
4. M-RoPE positions and ``rope_delta`` for the Qwen families;
5. the prefix-cache key: the prompt ids with each image's tokens replaced by
   a negative id derived from the image's digest (real ids are never
   negative), so two different images never share cached KV past their first
   image token while the text before them still matches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from edge_runtime.errors import InvalidInputError
from edge_runtime.generation.vision.engine import EmbeddedPrompt
from edge_runtime.generation.vision.positions import mrope_positions
from edge_runtime.generation.vision.splice import splice_image_features

if TYPE_CHECKING:
    from edge_runtime.generation.chat import ChatTokenizer
    from edge_runtime.generation.prepared import PromptEstimate
    from edge_runtime.generation.vision.embeddings import TokenEmbedder
    from edge_runtime.generation.vision.encoder import VisionEncoder
    from edge_runtime.generation.vision.feature_cache import ImageFeatureCache
    from edge_runtime.generation.vision.folder import VLMFolder
    from edge_runtime.generation.vision.images import ImageAccess
    from edge_runtime.generation.vision.messages import ImageInput
    from edge_runtime.generation.vision.preprocess import ImageProcessor, PreparedImage


@dataclass(frozen=True)
class ImageTimings:
    """Where a request's image work went, before it was queued."""

    images: int = 0
    image_tokens: int = 0
    decode_ms: float = 0.0  # reading and decoding the images
    preprocess_ms: float = 0.0  # resizing, normalising, patching
    encode_ms: float = 0.0  # the vision encoder (its wait for another request's encode included), embedding, splice
    cached_images: int = 0  # images whose features came from the ImageFeatureCache (not encoded)
    encoded_tokens: int = 0  # image tokens the encoder produced for this request (the rest were cached)

    def to_dict(self) -> dict[str, Any]:
        return {"images": self.images, "images_cached": self.cached_images, "image_tokens": self.image_tokens,
                "image_decode_ms": round(self.decode_ms, 3),
                "image_preprocess_ms": round(self.preprocess_ms, 3), "vision_encode_ms": round(self.encode_ms, 3)}


@dataclass(frozen=True)
class VisionPrompt:
    ids: list[int]
    text: str  # the prompt text with each image's tokens written out
    inputs: EmbeddedPrompt
    cache_key: list[int]
    timings: ImageTimings


def image_key_id(digest: bytes) -> int:
    """The prefix-cache id standing for every token of the image with content ``digest``: negative,
    so it never equals a vocabulary id, and equal only for equal digests (62 bits of them)."""
    return -1 - (int.from_bytes(digest[:8], "big") >> 2)


class VisionPrompter:
    """Builds ``VisionPrompt``s for one VLM; thread-safe (its parts are)."""

    def __init__(self, vlm: "VLMFolder", tokenizer: "ChatTokenizer", processor: "ImageProcessor",
                 encoder: "VisionEncoder", embedder: "TokenEmbedder", access: "ImageAccess", max_images: int,
                 features: "ImageFeatureCache | None" = None, max_tokens: int | None = None) -> None:
        """``max_tokens``: the model's context; an image of more image tokens is refused before it is
        resized (a request's own budget can ask for any size)."""
        from edge_runtime.generation.vision.cost import ImageCost
        from edge_runtime.generation.vision.feature_cache import ImageFeatureCache

        self.vlm = vlm
        self.features = features if features is not None else ImageFeatureCache(0)
        self.cost = ImageCost()  # learnt from build, read by estimate
        self.tokenizer = tokenizer
        self.processor = processor
        self.encoder = encoder
        self.embedder = embedder
        self.access = access
        self.max_images = max_images
        self.max_tokens = max_tokens
        marker = processor.placeholder
        if vlm.mrope:  # the Qwen and GLM templates wrap each image's placeholder in start/end tokens
            end = vlm.config.get("vision_end_token_id", vlm.config.get("image_end_token_id"))
            marker = (tokenizer.token_text(vlm.vision_start_token_id) + marker
                      + (tokenizer.token_text(end) if isinstance(end, int) else ""))
        self.image_marker = marker  # what one image is in a plain prompt without placeholders

    def warm_up(self) -> float:
        """Preprocess and encode one small blank image (the encoder's first-run allocations happen
        here, not in a request); returns the milliseconds it took."""
        from PIL import Image

        started = time.perf_counter()
        processed = self.processor.process(Image.new("RGB", (56, 56), (128, 128, 128)), "warm-up image")
        self.encoder.encode(processed.feeds, processed.num_tokens)
        return (time.perf_counter() - started) * 1e3

    def build(self, text: str, images: Sequence["ImageInput"], *, add_special_tokens: bool) -> VisionPrompt:
        """Decoder inputs of ``text`` (rendered by the chat template, or a plain prompt) with ``images``.

        A plain prompt (``add_special_tokens``) without any placeholder gets one image marker per
        image in front. Raises InvalidInputError (too many images, a bad image naming its part,
        placeholders and images that do not pair up).
        """
        from edge_runtime.generation.vision.images import image_from_url
        from edge_runtime.generation.vision.preprocess import PreparedImage, prepare_image

        if len(images) > self.max_images:
            raise InvalidInputError(f"At most {self.max_images} image(s) may be provided in one prompt.")
        if add_special_tokens and self.processor.placeholder not in text:
            text = self.image_marker * len(images) + text
        placeholders = text.count(self.processor.placeholder)
        if placeholders != len(images):  # checked before any image is decoded (expand checks it too)
            raise InvalidInputError(f"the prompt has {placeholders} image placeholder(s) "
                                    f"{self.processor.placeholder!r} but {len(images)} image(s) were given")
        processors = [self.processor_for(image) for image in images]  # bad budgets refused before any decoding
        prepared, sources, fetch_s = [], [], 0.0
        for image, processor in zip(images, processors):
            started = time.perf_counter()
            # the same data URL again (under the same budget): nothing to decode
            key = self.features.source_key(image.source, processor.tag)
            hit = self.features.get_source(key)
            if hit is not None:
                fetch_s += time.perf_counter() - started
                prepared.append(PreparedImage(hit.processed, hit.digest, 0.0, 0.0, hit.features))
                continue
            source = image_from_url(image.source, image.where, self.access) if image.is_url else image.source
            fetch_s += time.perf_counter() - started
            prepared.append(prepare_image(source, image.where, self.access, processor, self.features,
                                          self.max_tokens))
            sources.append((key, prepared[-1]))
        expanded = self.processor.expand(text, [p.processed for p in prepared])
        ids = self.tokenizer.tokenizer.encode(expanded, add_special_tokens=add_special_tokens).ids
        started = time.perf_counter()
        features = [p.features if p.features is not None else self._encode(p) for p in prepared]
        for key, image in sources:  # now in the cache (unless over its budget)
            self.features.add_source(key, image.digest)
        rows = np.concatenate(features) if features else np.zeros((0, self.vlm.hidden_size), np.float32)
        embeds = splice_image_features(ids, self.embedder.embed(ids), rows,
                                       image_token_id=self.vlm.image_token_id)
        positions, delta = None, 0
        if self.vlm.mrope:
            grids = [p.processed.grid_thw for p in prepared]
            if any(g is None for g in grids):
                raise InvalidInputError("an M-RoPE model's preprocessor gave no image grid")
            assert self.vlm.vision_start_token_id is not None
            positions, delta = mrope_positions(ids, grids, image_token_id=self.vlm.image_token_id,
                                               vision_start_token_id=self.vlm.vision_start_token_id,
                                               spatial_merge_size=self.vlm.spatial_merge_size)
        encoded = time.perf_counter()
        key, image_tokens = list(ids), 0
        at = [i for i, token in enumerate(ids) if token == self.vlm.image_token_id]
        for p in prepared:  # the splice checked that the counts add up
            mark = image_key_id(p.digest)
            for i in at[image_tokens:image_tokens + p.processed.num_tokens]:
                key[i] = mark
            image_tokens += p.processed.num_tokens
        encoded_tokens = sum(p.processed.num_tokens for p in prepared if p.features is None)
        timings = ImageTimings(len(prepared), image_tokens, (fetch_s + sum(p.decode_s for p in prepared)) * 1e3,
                               sum(p.preprocess_s for p in prepared) * 1e3, (encoded - started) * 1e3,
                               sum(p.features is not None for p in prepared), encoded_tokens)
        self.cost.observe(len(sources), timings.decode_ms + timings.preprocess_ms, encoded_tokens, timings.encode_ms)
        return VisionPrompt(ids, expanded, EmbeddedPrompt(embeds, positions, delta), key, timings)

    def estimate(self, text: str, images: Sequence["ImageInput"], *, add_special_tokens: bool,
                 cached: "Callable[[list[int]], int]") -> PromptEstimate | None:
        """What ``build(text, images)`` and its prefill will cost, without decoding an image: sizes from
        the images' headers, the prompt's tokens from the processor's budget (exact), images the
        feature cache holds free, ``cached(ids)`` the prefix cache's match of the text before the
        first image. None when a size is unknown without fetching (http(s), files) or the request
        is malformed (``build`` then names the fault)."""
        from edge_runtime.generation.prepared import PromptEstimate
        from edge_runtime.generation.vision.images import image_size
        from edge_runtime.generation.vision.preprocess import check_image_tokens, join_prompt

        try:
            parts = self._split(text, len(images), add_special_tokens)
        except InvalidInputError:
            return None
        new_images = new_tokens = 0
        image_texts = []
        for image in images:
            try:
                processor = self.processor_for(image)
            except InvalidInputError:
                return None
            hit = self.features.peek_source(self.features.source_key(image.source, processor.tag))
            if hit is not None:
                image_texts.append(hit.processed.prompt_text)
                continue
            size = image_size(image.source, self.access)
            if size is None:
                return None
            try:
                check_image_tokens(processor, size, image.where, self.max_tokens)
                image_texts.append(processor.prompt_text(*size))
                new_images, new_tokens = new_images + 1, new_tokens + processor.num_tokens(*size)
            except InvalidInputError:
                return None
        expanded = join_prompt(parts, image_texts)
        ids = self.tokenizer.tokenizer.encode(expanded, add_special_tokens=add_special_tokens).ids
        image_id = self.vlm.image_token_id
        first = ids.index(image_id) if image_id in ids else len(ids)
        return PromptEstimate(len(ids), cached(ids[:first + 1]), self.cost.predict_ms(new_images, new_tokens))

    def token_ids(self, text: str, images: Sequence["ImageInput"], *, add_special_tokens: bool,
                  encode_special: bool | None = None) -> list[int]:
        """The ids ``build`` gives this prompt, without the vision encoder: each image is only decoded
        for its size (the image tokens it stands for). ``encode_special``: whether the tokenizer adds
        its special tokens (default: ``add_special_tokens``, a plain prompt). InvalidInputError as
        ``build`` raises it."""
        from edge_runtime.generation.vision.images import image_from_url, load_image
        from edge_runtime.generation.vision.preprocess import check_image_tokens, join_prompt

        parts = self._split(text, len(images), add_special_tokens)
        texts = []
        for image in images:
            processor = self.processor_for(image)
            hit = self.features.peek_source(self.features.source_key(image.source, processor.tag))
            if hit is not None:
                texts.append(hit.processed.prompt_text)
                continue
            decoded = (image_from_url(image.source, image.where, self.access) if image.is_url
                       else load_image(image.source, image.where, self.access))
            check_image_tokens(processor, decoded.size, image.where, self.max_tokens)
            texts.append(processor.prompt_text(*decoded.size))
        special = add_special_tokens if encode_special is None else encode_special
        return self.tokenizer.tokenizer.encode(join_prompt(parts, texts), add_special_tokens=special).ids

    def processor_for(self, image: "ImageInput") -> "ImageProcessor":
        """The image processor under ``image``'s own budget (the request's ``mm_processor_kwargs``, then the
        part's keys, over the model's); InvalidInputError names a bad argument."""
        if not image.overrides:
            return self.processor
        from edge_runtime.generation.vision.preprocess import VisionBudget

        budget = VisionBudget()
        for where, kwargs in image.overrides:
            budget = self.processor.request_budget(kwargs, where).over(budget)
        return self.processor.with_budget(budget, " / ".join(where for where, _ in image.overrides))

    def _split(self, text: str, images: int, add_special_tokens: bool) -> list[str]:
        """``text`` cut at its image placeholders (a plain prompt without any gets one marker per image in
        front); InvalidInputError for too many images or placeholders that do not pair with them."""
        if images > self.max_images:
            raise InvalidInputError(f"At most {self.max_images} image(s) may be provided in one prompt.")
        if add_special_tokens and self.processor.placeholder not in text:
            text = self.image_marker * images + text
        parts = text.split(self.processor.placeholder)
        if len(parts) - 1 != images:
            raise InvalidInputError(f"the prompt has {len(parts) - 1} image placeholder(s) "
                                    f"{self.processor.placeholder!r} but {images} image(s) were given")
        return parts

    def _encode(self, prepared: "PreparedImage") -> np.ndarray:
        """The encoder's rows for one image, kept in the feature cache for the next prompt with it."""
        features = self.encoder.encode(prepared.processed.feeds, prepared.processed.num_tokens)
        self.features.put(prepared.digest, prepared.processed, features)
        return features
