"""``CloudClient``: a KServe v2 REST client on aiohttp for the device's cloud peer.

One connection pool per client; binary tensors (or JSON for servers without
the extension); a total timeout per call and a shorter connect timeout;
``Authorization: Bearer`` when a token is configured; TLS verification always
on, with an extra CA bundle when ``ca_file`` is set.

Retries happen only where they are safe: when the request never reached the
wire (connection refused, connect timeout). Once the request headers were
sent, the peer may run the request, so a timeout or a reset after that point
is *not* retried: it raises ``CloudCallError`` with ``maybe_ran = True`` and
the caller decides (and says so in its result) whether to run it locally too.

Threads: the client owns an event-loop thread. ``infer`` is synchronous (for
plans, which the scheduler runs in worker threads); ``infer_async`` awaits the
same call from any other event loop. Never call ``infer`` on the client's own
loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Coroutine, Mapping, TypeVar
from urllib.parse import quote

import numpy as np

from edge_runtime.cloud.breaker import CircuitBreaker
from edge_runtime.cloud.config import CloudConfig
from edge_runtime.cloud.network import NetworkEstimator
from edge_runtime.cloud.wire import CloudResponseError, decode_response, server_compute_ms
from edge_runtime.errors import BackendError, CloudError

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)
T = TypeVar("T")

# Failure kinds. "Sent" kinds happened after the request headers went out.
NOT_SENT_KINDS = ("breaker_open", "refused", "connect_timeout", "tls")
SENT_KINDS = ("timeout", "reset", "http_error", "bad_response")


class CloudCallError(CloudError, BackendError):
    """A cloud call failed. Also a ``BackendError`` so the scheduler re-runs the plan locally.

    ``kind`` is one of ``NOT_SENT_KINDS`` or ``SENT_KINDS``; ``sent`` says whether the
    request reached the wire; ``maybe_ran`` whether the peer may have run it (sent,
    and no error answer came back); ``attempts`` counts tries (0: the breaker refused).
    """

    def __init__(self, message: str, *, kind: str, sent: bool, attempts: int, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.sent = sent
        self.attempts = attempts
        self.status = status

    @property
    def maybe_ran(self) -> bool:
        return self.sent and self.kind != "http_error"


@dataclass(frozen=True)
class CloudCall:
    """A successful call: outputs and the facts about it."""

    outputs: dict[str, np.ndarray]
    model: str
    elapsed_ms: float  # the answered attempt, from sending to the last response byte
    sent_bytes: int
    received_bytes: int
    attempts: int  # > 1: earlier tries failed before sending (safe retries)
    server_ms: float | None  # the peer's own compute time, where it reports one
    parameters: Mapping[str, Any] = field(default_factory=dict)

    @property
    def retried(self) -> bool:
        return self.attempts > 1


@dataclass
class _Attempt:
    """Per-attempt trace state: whether the request headers went out."""

    sent: bool = False


class CloudClient:
    """See the module docstring. Use as a context manager or call ``close()``.

    ``breaker`` (default: from the config) gates ``infer``; ``network`` (default:
    a fresh estimator) learns RTT from ``ready()`` probes. Both are shared with plans.
    """

    def __init__(self, config: CloudConfig, *, breaker: CircuitBreaker | None = None,
                 network: NetworkEstimator | None = None) -> None:
        self.config = config
        self.breaker = breaker or CircuitBreaker(config.breaker_failures, config.breaker_reset_ms)
        self.network = network or NetworkEstimator()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="edge-runtime-cloud", daemon=True)
        self._thread.start()
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Close the pool and stop the loop thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._session is not None:
            asyncio.run_coroutine_threadsafe(self._session.close(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> "CloudClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._closed:
            coro.close()
            raise CloudError("cloud client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _wait(self, coro: Coroutine[Any, Any, T], timeout_ms: float) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("CloudClient: a synchronous call from the client's own loop thread would deadlock")
        # aiohttp enforces the call's timeout; the margin here only guards against a wedged loop.
        return self._submit(coro).result(timeout=timeout_ms / 1e3 + 5.0)

    async def _get_session(self) -> "aiohttp.ClientSession":
        import aiohttp

        if self._session is None:
            context: ssl.SSLContext | bool = True
            if self.config.is_tls:
                context = ssl.create_default_context()
                if self.config.ca_file is not None:
                    context.load_verify_locations(cafile=str(self.config.ca_file))
            trace = aiohttp.TraceConfig()
            trace.on_request_headers_sent.append(_mark_sent)
            connector = aiohttp.TCPConnector(limit=self.config.max_connections, ssl=context)
            self._session = aiohttp.ClientSession(connector=connector, trace_configs=[trace])
        return self._session

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        if self.config.token:
            headers["Authorization"] = f"Bearer {self.config.token}"
        return headers

    def _url(self, *parts: str) -> str:
        return "/".join([self.config.base_url, *(quote(p, safe="") for p in parts)])

    # -- inference -------------------------------------------------------------------------
    def infer(self, model: str, feeds: Mapping[str, np.ndarray], *, request_id: str | None = None,
              timeout_ms: float | None = None) -> CloudCall:
        """Run ``model`` on the peer; raises CloudCallError (see the class) on any failure."""
        timeout_ms = timeout_ms or self.config.timeout_ms
        try:
            return self._wait(self._infer(model, feeds, request_id, timeout_ms), timeout_ms)
        except concurrent.futures.TimeoutError:
            raise CloudCallError(f"cloud model {model!r}: the client's loop did not answer within "
                                 f"{timeout_ms:.0f} ms (the peer may have run it)", kind="timeout", sent=True,
                                 attempts=1) from None

    async def infer_async(self, model: str, feeds: Mapping[str, np.ndarray], *, request_id: str | None = None,
                          timeout_ms: float | None = None) -> CloudCall:
        """As ``infer``, awaitable from any event loop (the call itself runs on the client's loop)."""
        timeout_ms = timeout_ms or self.config.timeout_ms
        return await asyncio.wrap_future(self._submit(self._infer(model, feeds, request_id, timeout_ms)))

    async def _infer(self, model: str, feeds: Mapping[str, np.ndarray], request_id: str | None,
                     timeout_ms: float) -> CloudCall:
        from edge_runtime.protocol.codec import encode_request

        binary = self.config.binary_tensors
        # NOTE: encode before asking the breaker: an encoding error after a half-open allow()
        # would leave the probe slot taken and the breaker half-open for good.
        encoded = encode_request({k: np.asarray(v) for k, v in feeds.items()}, binary=binary, request_id=request_id,
                                 parameters={"binary_data_output": True} if binary else None)
        if not self.breaker.allow():
            raise CloudCallError(f"cloud model {model!r}: circuit breaker open, not calling the peer",
                                 kind="breaker_open", sent=False, attempts=0)
        headers = {"Content-Type": encoded.content_type}
        if encoded.header_length is not None:
            headers["Inference-Header-Content-Length"] = str(encoded.header_length)
        try:
            call = await self._post_with_retries(model, encoded.body, self._headers(headers), timeout_ms)
        except CloudCallError:
            self.breaker.record_failure()
            raise
        self.breaker.record_success()
        return call

    async def _post_with_retries(self, model: str, body: bytes, headers: dict[str, str],
                                 timeout_ms: float) -> CloudCall:
        deadline = time.monotonic() + timeout_ms / 1e3
        attempts = 0
        while True:
            attempts += 1
            try:
                return await self._post(model, body, headers, deadline, attempts)
            except CloudCallError as exc:
                backoff_s = self.config.retry_backoff_ms / 1e3 * 2 ** (attempts - 1)
                retry = (exc.kind in ("refused", "connect_timeout") and attempts <= self.config.retries
                         and time.monotonic() + backoff_s < deadline)
                if not retry:
                    raise
                log.info("cloud model %s: %s; retry %d in %.0f ms (nothing was sent)",
                         model, exc, attempts, backoff_s * 1e3)
                await asyncio.sleep(backoff_s)

    async def _post(self, model: str, body: bytes, headers: dict[str, str], deadline: float,
                    attempts: int) -> CloudCall:
        import aiohttp

        session = await self._get_session()
        attempt = _Attempt()
        remaining_s = max(0.001, deadline - time.monotonic())
        timeout = aiohttp.ClientTimeout(total=remaining_s,
                                        sock_connect=min(remaining_s, self.config.connect_timeout_ms / 1e3))
        where = f"cloud model {model!r} at {self.config.base_url}"
        started = time.perf_counter()
        try:
            async with session.post(self._url("v2", "models", model, "infer"), data=body, headers=headers,
                                    timeout=timeout, trace_request_ctx=attempt) as response:
                payload = await response.read()
                status = response.status
                header_length = response.headers.get("Inference-Header-Content-Length")
        except aiohttp.ClientSSLError as exc:
            raise CloudCallError(f"{where}: TLS failed: {exc}", kind="tls", sent=False, attempts=attempts) from exc
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise _transport_error(where, exc, attempt.sent, attempts, remaining_s) from exc
        elapsed_ms = (time.perf_counter() - started) * 1e3
        if status != 200:
            raise CloudCallError(f"{where}: HTTP {status}: {_error_text(payload)}", kind="http_error",
                                 sent=True, attempts=attempts, status=status)
        try:
            decoded = decode_response(payload, int(header_length) if header_length else None, model)
        except (CloudResponseError, ValueError) as exc:
            raise CloudCallError(str(exc), kind="bad_response", sent=True, attempts=attempts) from exc
        return CloudCall(decoded.outputs, model, elapsed_ms, len(body), len(payload), attempts,
                         server_compute_ms(decoded.parameters), decoded.parameters)

    # -- health and metadata ---------------------------------------------------------------
    def ready(self, model: str | None = None, timeout_ms: float | None = None) -> bool:
        """Whether the peer (or ``model`` on it) is ready; never raises. A success feeds the RTT estimate."""
        timeout_ms = timeout_ms or self.config.timeout_ms
        path = ("v2", "models", model, "ready") if model else ("v2", "health", "ready")
        try:
            status, _ = self._wait(self._get(path, timeout_ms), timeout_ms)
        except (CloudError, concurrent.futures.TimeoutError) as exc:
            log.info("cloud peer not ready: %s", exc)
            return False
        return status == 200

    def metadata(self, model: str, timeout_ms: float | None = None) -> dict[str, Any]:
        """The peer's metadata of ``model`` (inputs, outputs); raises CloudError."""
        import json

        timeout_ms = timeout_ms or self.config.timeout_ms
        status, payload = self._wait(self._get(("v2", "models", model), timeout_ms), timeout_ms)
        if status != 200:
            raise CloudError(f"cloud model {model!r}: metadata HTTP {status}: {_error_text(payload)}")
        try:
            return dict(json.loads(payload))
        except (ValueError, TypeError) as exc:
            raise CloudError(f"cloud model {model!r}: metadata is not JSON: {exc}") from exc

    async def _get(self, path: tuple[str, ...], timeout_ms: float) -> tuple[int, bytes]:
        import aiohttp

        session = await self._get_session()
        started = time.perf_counter()
        try:
            async with session.get(self._url(*path), headers=self._headers(),
                                   timeout=aiohttp.ClientTimeout(total=timeout_ms / 1e3)) as response:
                payload = await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise CloudError(f"cloud peer {self.config.base_url}: {type(exc).__name__}: {exc}") from exc
        if response.status == 200:
            self.network.observe_rtt((time.perf_counter() - started) * 1e3)
        return response.status, payload


async def _mark_sent(session: Any, context: Any, params: Any) -> None:
    attempt = getattr(context, "trace_request_ctx", None)
    if isinstance(attempt, _Attempt):
        attempt.sent = True


def _transport_error(where: str, exc: BaseException, sent: bool, attempts: int, timeout_s: float) -> CloudCallError:
    """Classify a transport failure: before sending it is safe to retry, after it is not."""
    is_timeout = isinstance(exc, asyncio.TimeoutError)
    if not sent:
        kind = "connect_timeout" if is_timeout else "refused"
        return CloudCallError(f"{where}: could not connect ({type(exc).__name__}: {exc or 'timed out'})",
                              kind=kind, sent=False, attempts=attempts)
    if is_timeout:
        return CloudCallError(f"{where}: no answer within {timeout_s * 1e3:.0f} ms after the request was sent "
                              "(the peer may have run it)", kind="timeout", sent=True, attempts=attempts)
    return CloudCallError(f"{where}: connection lost after the request was sent ({type(exc).__name__}: {exc}; "
                          "the peer may have run it)", kind="reset", sent=True, attempts=attempts)


def _error_text(payload: bytes) -> str:
    import json

    try:
        message = json.loads(payload).get("error")
    except (ValueError, AttributeError):
        message = None
    text = message if isinstance(message, str) else payload[:200].decode(errors="replace")
    return text or "(empty body)"
