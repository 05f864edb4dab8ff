"""``ImageCost``: what a request's image work will cost on this model here, learnt from the requests
that did it.

The cloud router decides where a request runs *before* its images are decoded and
encoded — on a phone that work is most of an agent step (a ~1,000-token screenshot
is over a second of vision encoder on two cores), so deciding after it would pay it
even for a request then sent to the cloud. The estimate has two parts, each an
exponential moving average over the requests that did the work: decoding and
preprocessing per image (it follows the sources' pixel counts, which an agent's
screenshots keep constant) and encoding per image token (it follows the image
budget). Images the ``ImageFeatureCache`` holds cost nothing. Both are timed as the
requests saw them: an encode that waited for another request's turn counts its wait, so the
estimate follows concurrent image load.
"""

from __future__ import annotations

import threading

SMOOTHING = 0.3  # weight of the newest observation: a few requests follow a change of load or budget


class ImageCost:
    """Thread-safe: ``observe`` runs on request threads, ``predict_ms`` on the event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prepare_ms_per_image: float | None = None
        self._encode_ms_per_token: float | None = None

    def observe(self, images: int, prepare_ms: float, tokens: int, encode_ms: float) -> None:
        """One request's work: ``images`` decoded and preprocessed in ``prepare_ms``, ``tokens``
        image tokens encoded in ``encode_ms`` (zeros: that part did not run)."""
        with self._lock:
            if images > 0:
                self._prepare_ms_per_image = _smooth(self._prepare_ms_per_image, prepare_ms / images)
            if tokens > 0:
                self._encode_ms_per_token = _smooth(self._encode_ms_per_token, encode_ms / tokens)

    def predict_ms(self, images: int, tokens: int) -> float | None:
        """Milliseconds to decode, preprocess and encode ``images`` new images of ``tokens`` image
        tokens in all; None until both parts were measured (0.0 when there is nothing to do)."""
        if images == 0 and tokens == 0:
            return 0.0
        with self._lock:
            if self._prepare_ms_per_image is None or self._encode_ms_per_token is None:
                return None
            return images * self._prepare_ms_per_image + tokens * self._encode_ms_per_token


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)
