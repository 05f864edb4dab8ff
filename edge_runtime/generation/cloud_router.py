"""``GenerationRouter``: local generation, or the model's OpenAI-compatible cloud peer.

Per request, with the model's ``[cloud]`` mode:

* ``always``: the cloud.
* ``fallback``: the cloud when the prompt (plus ``max_tokens``) exceeds the
  local context, when the local queue is full (also when admission refuses
  the request), or when the estimated local time exceeds the cloud's. Local
  time = prompt tokens / measured prefill rate + new tokens / measured decode
  rate, stretched by the requests ahead; cloud time = the peer's measured
  time to first token + new tokens / its measured stream rate (both learnt
  from earlier calls, so the cloud is only chosen on speed once it was
  measured). ``latency_target_ms`` > 0 also sends a request whose local
  estimate exceeds it.

A cloud failure before the first token falls back to local (when the
request fits here); after it, the error ends the stream. Chunks from the peer
pass through one by one; its usage chunk is folded into the finishing chunk.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, AsyncIterator, Callable

from edge_runtime.errors import QueueFullError
from edge_runtime.generation.openai_cloud import CloudStreamError, OpenAICloud
from edge_runtime.generation.sequence import Chunk, Usage

if TYPE_CHECKING:
    from edge_runtime.cloud.breaker import CircuitBreaker
    from edge_runtime.cloud.config import CloudConfig, CloudModelConfig
    from edge_runtime.generation.model import GenerativeModel, PreparedPrompt
    from edge_runtime.generation.openai_params import OpenAIRequest
    from edge_runtime.generation.sampling import SamplingParams

log = logging.getLogger(__name__)
UNKNOWN_NEW_TOKENS = 64  # new tokens assumed for an estimate when max_tokens is not given


class GenerationRouter:
    def __init__(self, model: "GenerativeModel", cloud: "CloudModelConfig", config: "CloudConfig",
                 breaker: "CircuitBreaker", on_call: Callable[[str], None] | None = None) -> None:
        self.model = model
        self.cloud = cloud
        self.client = OpenAICloud(config, breaker)
        self._on_call = on_call or (lambda outcome: None)

    def fits_locally(self, prepared: "PreparedPrompt", params: "SamplingParams") -> bool:
        return len(prepared.ids) + (params.max_tokens or 1) <= self.model.context_length

    def local_estimate_ms(self, prompt_tokens: int, new_tokens: int) -> float | None:
        stats = self.model.batcher.stats()
        if not stats.prefill_tokens_per_s or not stats.decode_tokens_per_s:
            return None
        ahead = stats.queued / max(1, self.model.settings.max_batch_size)
        return (prompt_tokens / stats.prefill_tokens_per_s + new_tokens / stats.decode_tokens_per_s) * 1e3 * (
            1 + ahead)

    def cloud_estimate_ms(self, new_tokens: int) -> float | None:
        if self.client.first_token_ms is None or not self.client.tokens_per_s:
            return None
        return self.client.first_token_ms + new_tokens / self.client.tokens_per_s * 1e3

    def route(self, prepared: "PreparedPrompt", params: "SamplingParams") -> tuple[str, str]:
        """(``local`` or ``cloud``, why)."""
        if self.cloud.mode == "always":
            return "cloud", "mode always"
        if not self.fits_locally(prepared, params):
            return "cloud", "prompt exceeds the local context"
        stats = self.model.batcher.stats()
        if stats.queued >= self.model.settings.max_queue:
            return "cloud", "local queue full"
        new = params.max_tokens or UNKNOWN_NEW_TOKENS
        local = self.local_estimate_ms(len(prepared.ids), new)
        remote = self.cloud_estimate_ms(new)
        if local is not None and remote is not None and remote < local:
            return "cloud", f"estimated {remote:.0f} ms in the cloud < {local:.0f} ms here"
        if local is not None and self.cloud.latency_target_ms and local > self.cloud.latency_target_ms:
            return "cloud", f"estimated {local:.0f} ms here > target {self.cloud.latency_target_ms:g} ms"
        return "local", "local"

    async def stream(self, prepared: "PreparedPrompt", params: "SamplingParams",
                     request: "OpenAIRequest | None") -> AsyncIterator[Chunk]:
        where, reason = self.route(prepared, params)
        if where == "cloud" and request is not None:
            log.debug("model %s: cloud (%s)", self.model.name, reason)
            try:
                async for chunk in self._cloud(prepared, request):
                    yield chunk
                return
            except CloudStreamError as exc:
                if not exc.before_first_token or not self.fits_locally(prepared, params):
                    raise
                log.warning("model %s: cloud failed before the first token (%s); generating locally",
                            self.model.name, exc)
        local = self.model.stream_prepared(prepared, params)
        try:
            first = await anext(local)
        except QueueFullError:
            if self.cloud.mode == "never" or request is None:
                raise
            async for chunk in self._cloud(prepared, request):
                yield chunk
            return
        yield first
        async for chunk in local:
            yield chunk

    async def stream_remote(self, params: "SamplingParams", request: "OpenAIRequest") -> AsyncIterator[Chunk]:
        """``request`` through the peer whatever the mode: the local model cannot read it (an image
        for a text-only model). No local fallback: a cloud failure is the request's error."""
        from edge_runtime.generation.model import PreparedPrompt

        log.debug("model %s: cloud (the local model cannot read the request: %d image(s))", self.model.name,
                  len(request.images))
        async for chunk in self._cloud(PreparedPrompt([], ""), request):
            yield chunk

    async def _cloud(self, prepared: "PreparedPrompt", request: "OpenAIRequest") -> AsyncIterator[Chunk]:
        path = "/v1/chat/completions" if request.messages is not None else "/v1/completions"
        finishing: Chunk | None = None
        texts = 0
        try:
            async for chunk in self.client.stream(path, request.forward_body(self.cloud.remote_model)):
                if finishing is not None:  # the usage chunk after the finish: fold it in
                    finishing = dataclasses.replace(finishing, usage=chunk.usage or finishing.usage)
                    continue
                texts += 1 if chunk.text else 0
                if chunk.finish_reason is not None:
                    finishing = chunk
                    continue
                yield chunk
        except CloudStreamError as exc:
            self._on_call(exc.kind)
            raise
        self._on_call("ok")
        assert finishing is not None  # OpenAICloud raises when the stream had no finish_reason
        if finishing.usage is None:
            finishing = dataclasses.replace(finishing, usage=Usage(len(prepared.ids), texts))
        yield finishing

    def close(self) -> None:
        return None
