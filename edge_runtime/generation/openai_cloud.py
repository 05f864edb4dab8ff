"""``OpenAICloud``: streams one request from an OpenAI-compatible server (vLLM, SGLang, llama.cpp
server, Ollama, another edge-runtime) and turns its server-sent events into ``Chunk``s.

It shares the server's ``[cloud]`` settings with the KServe v2 client: the
bearer token, TLS verification always on (plus ``ca_file``), the connect and
total timeouts, and the same ``CircuitBreaker`` (a peer that fails v2 calls
is not tried for generation either). Every call is streamed (``stream:
true`` with ``include_usage``), so the caller can pass chunks on as they
arrive and knows whether any token came back before a failure.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Mapping

from edge_runtime.errors import CloudError
from edge_runtime.generation.sequence import Chunk, Usage

if TYPE_CHECKING:
    from edge_runtime.cloud.breaker import CircuitBreaker
    from edge_runtime.cloud.config import CloudConfig

log = logging.getLogger(__name__)


# Answers that fault this request's content, not the peer (bad parameters, an image it cannot
# read, a body too large): the peer is up, so they close the breaker like any answer instead of
# counting toward opening it. Faults every request would meet (401/403: the token, 404: the model
# name) and the peer timing out or overloaded (408, 429, 5xx) count, so the breaker saves the trips.
_REQUEST_FAULTS = frozenset({400, 413, 415, 422})


class CloudStreamError(CloudError):
    """The peer failed; ``before_first_token`` says whether the caller may still run it locally."""

    def __init__(self, message: str, *, kind: str, before_first_token: bool, counted: bool = False) -> None:
        """``counted``: already recorded on the breaker (a client error: the peer is up)."""
        super().__init__(message)
        self.kind = kind
        self.before_first_token = before_first_token
        self.counted = counted


def _ssl_context(config: "CloudConfig") -> ssl.SSLContext | bool:
    if not config.is_tls:
        return True
    context = ssl.create_default_context()
    if config.ca_file is not None:
        context.load_verify_locations(cafile=str(config.ca_file))
    return context


def parse_event(data: Mapping[str, Any]) -> Chunk:
    """One chunk of a chat or completion stream (a usage-only chunk has no choices)."""
    choices = data.get("choices") or []
    text, finish, calls, thought = "", None, (), ""
    if choices:
        choice = choices[0]
        delta = choice.get("delta")
        text = (delta.get("content") or "") if isinstance(delta, Mapping) else (choice.get("text") or "")
        finish = choice.get("finish_reason")
        if isinstance(delta, Mapping) and isinstance(delta.get("tool_calls"), list):
            calls = tuple(c for c in delta["tool_calls"] if isinstance(c, Mapping))
        if isinstance(delta, Mapping):  # a thinking peer's reasoning, under vLLM's new or old name
            thought = delta.get("reasoning") or delta.get("reasoning_content") or ""
            thought = thought if isinstance(thought, str) else ""
    usage = data.get("usage")
    parsed_usage = None
    if isinstance(usage, Mapping):
        parsed_usage = Usage(int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))
    return Chunk(text, (), (), finish, parsed_usage, tool_calls=calls, reasoning=thought)


class OpenAICloud:
    """One peer; ``stream(path, body)`` yields ``Chunk``s; the last carries finish_reason and usage."""

    def __init__(self, config: "CloudConfig", breaker: "CircuitBreaker") -> None:
        self.config = config
        self.breaker = breaker
        self.first_token_ms: float | None = None  # EWMA of the peer's time to first token
        self.tokens_per_s: float | None = None  # EWMA of its decode rate for one stream

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.config.token:
            headers["Authorization"] = f"Bearer {self.config.token}"
        return headers

    async def stream(self, path: str, body: Mapping[str, Any]) -> AsyncIterator[Chunk]:
        """POST ``body`` to ``{url}{path}``; raises CloudStreamError (and counts it on the breaker)."""
        import aiohttp

        if not self.breaker.allow():
            raise CloudStreamError("the cloud circuit breaker is open", kind="breaker_open", before_first_token=True)
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_ms / 1e3,
                                        sock_connect=self.config.connect_timeout_ms / 1e3)
        started = time.perf_counter()
        first: float | None = None
        tokens = 0
        finished = False
        try:
            connector = aiohttp.TCPConnector(ssl=_ssl_context(self.config))
            async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
                async with session.post(self.config.base_url + path, json=dict(body),
                                        headers=self._headers()) as response:
                    if response.status != 200:
                        text = (await response.text())[:300]
                        if response.status in _REQUEST_FAULTS:
                            self.breaker.record_success()  # the peer answered: this request, not the peer, failed
                        raise CloudStreamError(f"the cloud answered {response.status}: {text}", kind="http_error",
                                               before_first_token=True, counted=response.status in _REQUEST_FAULTS)
                    async for raw in response.content:
                        line = raw.decode("utf-8", "replace").strip()
                        if not line.startswith("data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == "[DONE]":
                            break
                        chunk = parse_event(json.loads(payload))
                        # anything a client may already have been sent counts: after it no local restart
                        said = bool(chunk.text or chunk.reasoning or chunk.tool_calls)
                        if said and first is None:
                            first = time.perf_counter()
                        tokens += 1 if said else 0
                        finished = finished or chunk.finish_reason is not None
                        yield chunk
        except CloudStreamError as exc:
            if not exc.counted:
                self.breaker.record_failure()
            raise
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, ssl.SSLError) as exc:
            self.breaker.record_failure()
            kind = "refused" if isinstance(exc, aiohttp.ClientConnectorError) else type(exc).__name__
            raise CloudStreamError(f"the cloud call failed: {exc or type(exc).__name__}", kind=kind,
                                   before_first_token=first is None) from None
        if not finished:
            self.breaker.record_failure()
            raise CloudStreamError("the cloud stream ended without a finish_reason", kind="bad_response",
                                   before_first_token=first is None)
        self.breaker.record_success()
        self._learn(started, first, tokens)

    def _learn(self, started: float, first: float | None, tokens: int) -> None:
        if first is None:
            return
        ttft = (first - started) * 1e3
        self.first_token_ms = ttft if self.first_token_ms is None else self.first_token_ms + 0.2 * (
            ttft - self.first_token_ms)
        elapsed = time.perf_counter() - first
        if tokens > 1 and elapsed > 0:
            rate = (tokens - 1) / elapsed
            self.tokens_per_s = rate if self.tokens_per_s is None else self.tokens_per_s + 0.2 * (
                rate - self.tokens_per_s)
