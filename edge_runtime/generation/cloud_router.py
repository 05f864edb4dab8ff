"""``GenerationRouter``: local generation, or the model's OpenAI-compatible cloud peer.

Per request, with the model's ``[cloud]`` mode:

* ``always``: the cloud.
* ``fallback``: the cloud when the prompt (plus ``max_tokens``) exceeds the
  local context, when the local queue is full (also when admission refuses
  the request), or when the estimated local time exceeds the cloud's. Local
  time = the prompt tokens the prefix cache lacks / measured prefill rate +
  new tokens / measured decode rate, stretched by the requests ahead, plus a
  vision-language request's image work (``vision.cost``); cloud time = the
  peer's measured time to first token + new tokens / its measured stream rate
  (all learnt from earlier calls, so the cloud is only chosen on speed once it
  was measured). ``latency_target_ms`` > 0 also sends a request whose local
  estimate exceeds it.

A request with images is routed from an estimate made before its images are
decoded (``stream_deferred``): sent to the cloud, it never pays its image work
here, which on a phone is most of an agent step.

A cloud failure before the first token falls back to local (when the
request fits here); after it, the error ends the stream. Chunks from the peer
pass through one by one; its usage chunk is folded into the finishing chunk.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, AsyncIterator, Awaitable, Callable

from edge_runtime.errors import QueueFullError
from edge_runtime.generation.openai_cloud import CloudStreamError, OpenAICloud
from edge_runtime.generation.prepared import PromptEstimate
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

    def fits_locally(self, prompt_tokens: int, params: "SamplingParams") -> bool:
        return prompt_tokens + (params.max_tokens or 1) <= self.model.context_length

    def local_estimate_ms(self, prompt_tokens: int, new_tokens: int, cached_tokens: int = 0,
                          image_ms: float | None = 0.0) -> float | None:
        """Prefill of the tokens the prefix cache lacks and decode, stretched by the requests ahead,
        plus the image work still to do (which runs beside the batcher, not behind it); None until
        the rates (and image work) were measured here."""
        stats = self.model.batcher.stats()
        if not stats.prefill_tokens_per_s or not stats.decode_tokens_per_s or image_ms is None:
            return None
        ahead = stats.queued / max(1, self.model.settings.max_batch_size)
        uncached = max(1, prompt_tokens - cached_tokens)
        return (uncached / stats.prefill_tokens_per_s + new_tokens / stats.decode_tokens_per_s) * 1e3 * (
            1 + ahead) + image_ms

    def cloud_estimate_ms(self, new_tokens: int) -> float | None:
        if self.client.first_token_ms is None or not self.client.tokens_per_s:
            return None
        return self.client.first_token_ms + new_tokens / self.client.tokens_per_s * 1e3

    def route(self, prepared: "PreparedPrompt", params: "SamplingParams") -> tuple[str, str]:
        """(``local`` or ``cloud``, why) for a prepared request (its image work, if any, done)."""
        return self.route_estimate(PromptEstimate(len(prepared.ids), self.model.cached_tokens(prepared), 0.0),
                                   params)

    def route_estimate(self, estimate: "PromptEstimate", params: "SamplingParams") -> tuple[str, str]:
        """(``local`` or ``cloud``, why) from what the request will cost here."""
        if self.cloud.mode == "always":
            return "cloud", "mode always"
        if not self.fits_locally(estimate.prompt_tokens, params):
            return "cloud", "prompt exceeds the local context"
        stats = self.model.batcher.stats()
        if stats.queued >= self.model.settings.max_queue:
            return "cloud", "local queue full"
        new = params.max_tokens or UNKNOWN_NEW_TOKENS
        local = self.local_estimate_ms(estimate.prompt_tokens, new, estimate.cached_tokens, estimate.image_ms)
        remote = self.cloud_estimate_ms(new)
        if local is not None and remote is not None and remote < local:
            return "cloud", f"estimated {remote:.0f} ms in the cloud < {local:.0f} ms here"
        if local is not None and self.cloud.latency_target_ms and local > self.cloud.latency_target_ms:
            return "cloud", f"estimated {local:.0f} ms here > target {self.cloud.latency_target_ms:g} ms"
        return "local", "local"

    async def stream_deferred(self, prepare: Callable[[], Awaitable["PreparedPrompt"]], estimate: "PromptEstimate",
                              params: "SamplingParams", request: "OpenAIRequest") -> AsyncIterator[Chunk]:
        """A request whose preparation is the expensive part (a VLM's images): routed from ``estimate``
        first, so one sent to the cloud never decodes or encodes its images here; ``prepare`` runs
        only to answer locally (chosen, or the cloud failed before its first token)."""
        where, reason = self.route_estimate(estimate, params)
        if where == "cloud":
            log.debug("model %s: cloud before any image work (%s)", self.model.name, reason)
            try:
                async for chunk in self._cloud(estimate.prompt_tokens, request):
                    yield chunk
                return
            except CloudStreamError as exc:
                if not exc.before_first_token or not self.fits_locally(estimate.prompt_tokens, params):
                    raise
                log.warning("model %s: cloud failed before the first token (%s); generating locally",
                            self.model.name, exc)
            prepared = await prepare()
            async for chunk in self._local(prepared, params, None):
                yield chunk
            return
        prepared = await prepare()  # local by the estimate; the exact prompt may still go to the cloud
        async for chunk in self.stream(prepared, params, request):
            yield chunk

    async def stream(self, prepared: "PreparedPrompt", params: "SamplingParams",
                     request: "OpenAIRequest | None") -> AsyncIterator[Chunk]:
        where, reason = self.route(prepared, params)
        if where == "cloud" and request is not None:
            log.debug("model %s: cloud (%s)", self.model.name, reason)
            try:
                async for chunk in self._cloud(len(prepared.ids), request):
                    yield chunk
                return
            except CloudStreamError as exc:
                if not exc.before_first_token or not self.fits_locally(len(prepared.ids), params):
                    raise
                log.warning("model %s: cloud failed before the first token (%s); generating locally",
                            self.model.name, exc)
                request = None  # tried: a full queue here is then the request's error
        async for chunk in self._local(prepared, params, request):
            yield chunk

    async def _local(self, prepared: "PreparedPrompt", params: "SamplingParams",
                     request: "OpenAIRequest | None") -> AsyncIterator[Chunk]:
        """Generate here; a full queue sends ``request`` to the cloud (unless None or mode never)."""
        local = self.model.stream_prepared(prepared, params)
        try:
            first = await anext(local)
        except QueueFullError:
            if self.cloud.mode == "never" or request is None:
                raise
            async for chunk in self._cloud(len(prepared.ids), request):
                yield chunk
            return
        yield first
        async for chunk in local:
            yield chunk

    async def stream_remote(self, params: "SamplingParams", request: "OpenAIRequest") -> AsyncIterator[Chunk]:
        """``request`` through the peer whatever the mode: the local model cannot read it (an image
        for a text-only model). No local fallback: a cloud failure is the request's error."""
        log.debug("model %s: cloud (the local model cannot read the request: %d image(s))", self.model.name,
                  len(request.images))
        async for chunk in self._cloud(0, request):
            yield chunk

    async def _cloud(self, prompt_tokens: int, request: "OpenAIRequest") -> AsyncIterator[Chunk]:
        """The peer's chunks; ``prompt_tokens`` stands in the usage of a peer that sends none."""
        path = "/v1/chat/completions" if request.messages is not None else "/v1/completions"
        finishing: Chunk | None = None
        texts = 0
        try:
            async for chunk in self.client.stream(path, request.forward_body(self.cloud.remote_model)):
                if finishing is not None:  # the usage chunk after the finish: fold it in
                    finishing = dataclasses.replace(finishing, usage=chunk.usage or finishing.usage)
                    continue
                texts += 1 if chunk.text or chunk.reasoning or chunk.tool_calls else 0
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
            finishing = dataclasses.replace(finishing, usage=Usage(prompt_tokens, texts))
        yield finishing

    def close(self) -> None:
        return None
