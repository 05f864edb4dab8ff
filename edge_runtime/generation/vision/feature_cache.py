"""``ImageFeatureCache``: an image's vision-encoder output kept across requests, keyed by its pixels.

Chat clients resend the whole conversation at every turn, images included, and
agents that keep their last few screenshots in the history (UI-TARS keeps up to
five) resend each screenshot at several steps. Encoding one costs from a few
hundred milliseconds to seconds on a phone CPU, and the prefix cache cannot
spare it once the text before the image changed (the oldest screenshot dropped
out of the window, a system prompt edited). So what the encoder gave for an
image — the rows spliced into the prompt — is kept with the preprocessor's
description of it (token count, grid, prompt text), keyed by the image's
content digest (``images.image_digest``: mode, size and pixels; mixed with the
budget's tag when a request chose its own image budget, ``preprocess.tagged_digest``).
A model's preprocessing and encoder are fixed while it is loaded, so equal pixels
under one budget give equal rows: a hit skips preprocessing and the encoder (the digest is of the
decoded pixels, so a PNG and a lossless WebP of one screen are one entry). An
image sent as the very same encoded data (a ``data:`` URL or bytes, what chat
clients resend) is also found by a hash of that data (``source_key``), which
skips base64 and image decoding too: decoding is deterministic, so equal data
means equal pixels. Least recently used entries go first under a byte budget
(``[vision] feature_cache_bytes``; 0 turns the cache off).

Thread-safe: prompts are built on request threads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from edge_runtime.generation.vision.preprocess import ProcessedImage

# Encoded-data hashes remembered (16 bytes each, plus their digests): far more than the entries a
# feature budget holds; a key whose entry was evicted goes when it is next looked up.
MAX_SOURCES = 4096


@dataclass(frozen=True)
class CachedImage:
    processed: ProcessedImage  # without its feeds: the encoder does not run again
    features: np.ndarray  # [tokens, hidden] float32, read-only
    digest: bytes  # of the decoded pixels and budget (``preprocess.tagged_digest``): the prefix cache's image key


@dataclass(frozen=True)
class ImageFeatureCacheStats:
    hits: int  # images whose features were reused (source_hits of them found by their encoded data)
    source_hits: int
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
        self._sources: OrderedDict[bytes, bytes] = OrderedDict()  # source_key -> digest
        self._hits = self._misses = self._evicted = self._source_hits = 0
        self._lock = threading.Lock()

    def source_key(self, source: object, tag: bytes = b"") -> bytes | None:
        """A hash of an image input's encoded data (a ``data:`` URL string or bytes) and of the image
        budget it is processed under (``ImageProcessor.tag``), or None for inputs read from elsewhere (a
        path or an http URL may change behind the same name) or a PIL image."""
        if self.budget_bytes == 0:
            return None
        if isinstance(source, str) and source[:5].lower() == "data:":
            source = source.encode("utf-8", "surrogatepass")
        elif not isinstance(source, (bytes, bytearray, memoryview)):
            return None
        digest = hashlib.sha256(source)
        if tag:
            digest.update(b"|" + tag)
        return digest.digest()[:16]

    def get_source(self, key: bytes | None) -> CachedImage | None:
        """The entry of the image whose encoded data hashed to ``key`` (``source_key``), or None; a
        miss here is not counted (``get`` by the decoded pixels follows)."""
        if key is None:
            return None
        with self._lock:
            digest = self._sources.get(key)
            entry = self._entries.get(digest) if digest is not None else None
            if entry is None:
                if digest is not None:  # its entry was evicted
                    del self._sources[key]
                return None
            self._sources.move_to_end(key)
            self._entries.move_to_end(digest)
            self._hits += 1
            self._source_hits += 1
            return entry

    def peek_source(self, key: bytes | None) -> CachedImage | None:
        """As ``get_source``, but neither counted nor made recent: for estimating a request's cost
        before deciding where it runs."""
        if key is None:
            return None
        with self._lock:
            digest = self._sources.get(key)
            return self._entries.get(digest) if digest is not None else None

    def add_source(self, key: bytes | None, digest: bytes) -> None:
        """Remember that the encoded data ``key`` decodes to the image ``digest`` (kept while at most
        ``MAX_SOURCES`` such keys are)."""
        if key is None:
            return
        with self._lock:
            if digest not in self._entries:
                return
            self._sources[key] = digest
            self._sources.move_to_end(key)
            while len(self._sources) > MAX_SOURCES:
                self._sources.popitem(last=False)

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
        entry = CachedImage(dataclasses.replace(processed, feeds={}), features, digest)
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
            return ImageFeatureCacheStats(self._hits, self._source_hits, self._misses, self._evicted,
                                          len(self._entries), self._bytes, self.budget_bytes)
