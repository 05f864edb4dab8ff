"""``VisionStats``: per-model totals of the image work, read by ``/metrics`` at scrape time.

Histograms of image decode + preprocess time and of vision-encode time (one
observation per request that carried images) and a counter of image tokens.
Kept as plain cumulative bucket counts under a lock, so the model needs no
Prometheus import; the server's collector turns them into families.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

# Seconds: an image on a phone CPU costs from milliseconds (a small budget) to tens of seconds (none).
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class HistogramSnapshot:
    buckets: tuple[tuple[float, int], ...]  # (upper bound, cumulative count), +Inf last
    total_s: float


class _Histogram:
    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS_S) + 1)
        self.total_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS_S, seconds)] += 1
        self.total_s += seconds

    def snapshot(self) -> HistogramSnapshot:
        cumulative, running = [], 0
        for bound, count in zip((*BUCKETS_S, float("inf")), self.counts):
            running += count
            cumulative.append((bound, running))
        return HistogramSnapshot(tuple(cumulative), self.total_s)


class VisionStats:
    """Thread-safe: ``record`` runs on request threads, ``snapshot`` on the scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._preprocess = _Histogram()
        self._encode = _Histogram()
        self.images = 0
        self.image_tokens = 0

    def record(self, images: int, image_tokens: int, preprocess_s: float, encode_s: float) -> None:
        with self._lock:
            self.images += images
            self.image_tokens += image_tokens
            self._preprocess.observe(preprocess_s)
            self._encode.observe(encode_s)

    def snapshot(self) -> tuple[HistogramSnapshot, HistogramSnapshot, int, int]:
        """(decode + preprocess, encode, images, image tokens)."""
        with self._lock:
            return self._preprocess.snapshot(), self._encode.snapshot(), self.images, self.image_tokens
