"""A request as prepared for the batcher (``PreparedPrompt``) and where its time went (``RequestTimings``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edge_runtime.generation.sequence import Sequence

if TYPE_CHECKING:
    from edge_runtime.generation.vision.prompt import ImageTimings


@dataclass(frozen=True)
class PreparedPrompt:
    """A request's prompt as token ids (and the text they came from).

    A prompt with images also carries the engine's precomputed inputs (``inputs``), its
    prefix-cache key (``cache_key``) and what its images cost (``image_timings``).
    """

    ids: list[int]
    text: str
    inputs: Any = None
    cache_key: list[int] | None = None
    image_timings: "ImageTimings | None" = None


@dataclass(frozen=True)
class PromptEstimate:
    """What a request will cost here, known before its prompt is prepared (for routing it).

    ``prompt_tokens``: its length with each image's tokens (placeholder text aside: a few tokens
    off for tiled images); ``cached_tokens``: how many of them the prefix cache holds now (the
    text before the first image at most); ``image_ms``: its image work still to do here, None
    when not measured yet.
    """

    prompt_tokens: int
    cached_tokens: int
    image_ms: float | None


@dataclass(frozen=True)
class RequestTimings:
    """Where one request's time to first token went, in milliseconds."""

    prepare_ms: float  # template, tokeniser and all image work below
    image_decode_ms: float  # reading and decoding images (part of prepare)
    image_preprocess_ms: float  # resize, normalise, patch (part of prepare)
    vision_encode_ms: float  # vision encoder, embedding and splice (part of prepare)
    queue_ms: float  # queued until its first prefill chunk
    prefill_ms: float  # first prefill chunk to the last one (decode steps of other streams interleave)
    first_token_ms: float  # from the call to the first token: all of the above, plus sampling

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.__dict__.items()}


def request_timings(prepared: PreparedPrompt, handle: Any, started_s: float,
                    submitted_s: float) -> RequestTimings | None:
    """The time breakdown of a finished request called at ``started_s`` and queued at ``submitted_s``
    (``time.perf_counter``); None when the batcher keeps no per-sequence times (onnxruntime-genai) or
    the request never reached its first token."""
    if not isinstance(handle, Sequence) or handle.first_token_s is None or handle.prefill_started_s is None:
        return None
    image = prepared.image_timings
    done = handle.prefill_done_s if handle.prefill_done_s is not None else handle.first_token_s
    return RequestTimings((submitted_s - started_s) * 1e3, image.decode_ms if image else 0.0,
                          image.preprocess_ms if image else 0.0, image.encode_ms if image else 0.0,
                          max(0.0, handle.prefill_started_s - submitted_s) * 1e3,
                          (done - handle.prefill_started_s) * 1e3, (handle.first_token_s - started_s) * 1e3)
