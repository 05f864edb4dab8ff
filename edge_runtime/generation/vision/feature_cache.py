"""``ImageFeatureCache``: an image's vision-encoder output kept across requests, keyed by its pixels.

Chat clients resend the whole conversation at every turn, images included, and
agents that keep their last few screenshots in the history (UI-TARS keeps up to
five) resend each screenshot at several steps. Encoding one costs from a few
hundred milliseconds to seconds on a phone CPU, and the prefix cache cannot
spare it once the text before the image changed (the oldest screenshot dropped
out of the window, a system prompt edited). So what the encoder gave for an
image — the rows spliced into the prompt — is kept with the preprocessor's
description of it (token count, grid, prompt text), keyed by the image's
content digest (``images.image_digest``: mode, size and pixels). A model's
preprocessing and encoder are fixed while it is loaded, so equal pixels give
equal rows: a hit skips preprocessing and the encoder, not decoding (the digest
is of the decoded pixels, so a PNG and a lossless WebP of one screen are one
entry). Least recently used entries go first under a byte budget
(``[vision] feature_cache_bytes``; 0 turns the cache off).

Thread-safe: prompts are built on request threads.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from edge_runtime.generation.vision.preprocess import ProcessedImage


@dataclass(frozen=True)
class CachedImage:
    processed: ProcessedImage  # without its feeds: the encoder does not run again
    features: np.ndarray  # [tokens, hidden] float32, read-only


@dataclass(frozen=True)
class ImageFeatureCacheStats:
    hits: int  # images whose features were reused
    misses: int  # images encoded while the cache was on
    evicted: int
    entries: int
    bytes: int
    budget_bytes: int


class ImageFeatureCache:
    """At most ``budget_bytes`` of feature rows (0: off, nothing kept or counted)."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[bytes, CachedImage] = OrderedDict()
        self._bytes = 0
        self._hits = self._misses = self._evicted = 0
        self._lock = threading.Lock()

    def get(self, digest: bytes) -> CachedImage | None:
        """The entry of the image with content ``digest`` (now the most recently used), or None."""
        if self.budget_bytes == 0:
            return None
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                self._misses += 1
                return None
            self._entries.move_to_end(digest)
            self._hits += 1
            return entry

    def put(self, digest: bytes, processed: ProcessedImage, features: np.ndarray) -> bool:
        """Keep ``features`` (made read-only) for the image ``digest``; False when it alone exceeds the
        budget. Older entries are evicted to make room."""
        if features.nbytes > self.budget_bytes:
            return False
        features.flags.writeable = False  # shared by every later prompt with this image
        entry = CachedImage(dataclasses.replace(processed, feeds={}), features)
        with self._lock:
            old = self._entries.pop(digest, None)
            if old is not None:  # two requests encoded the same new image at once
                self._bytes -= old.features.nbytes
            self._entries[digest] = entry
            self._bytes += features.nbytes
            while self._bytes > self.budget_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.features.nbytes
                self._evicted += 1
        return True

    def stats(self) -> ImageFeatureCacheStats:
        with self._lock:
            return ImageFeatureCacheStats(self._hits, self._misses, self._evicted, len(self._entries), self._bytes,
                                          self.budget_bytes)
