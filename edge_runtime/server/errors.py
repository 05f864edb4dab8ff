"""The one table from the error family to HTTP: status, failure reason, extra headers.

Only the server knows HTTP. Core errors carry no status; this module maps
them, most specific class first. A few errors exist only on the wire (a
missing token, an unknown task); they join the family here.

| error                          | status | metrics reason |
|--------------------------------|--------|----------------|
| QueueFullError                 | 429 (``overload_status``: 429 or 503), always ``Retry-After`` | REJECTED |
| DeadlineExceededError          | 504    | TIMEOUT        |
| InvalidInputError, ConfigError | 400    | INVALID        |
| UnsupportedNodesError, ModelLoadError | 400 (a load request that cannot succeed) | OTHER |
| ModelNotFoundError, TaskNotFoundError | 404 | OTHER      |
| RequestTooLargeError           | 413    | INVALID        |
| UnauthorizedError              | 401, ``WWW-Authenticate: Bearer`` | OTHER |
| TaskStateError                 | 409    | OTHER          |
| CloudError                     | 502    | BACKEND        |
| BackendError, BackendUnavailableError | 503 | BACKEND     |
| any other EdgeRuntimeError (shutting down) | 503 | OTHER  |
| anything else (a bug)          | 500, message hidden, logged | OTHER |

A request cancelled before it ran (an async task deleted) counts as CANCELED.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from edge_runtime.errors import (
    BackendError,
    BackendUnavailableError,
    CloudError,
    ConfigError,
    DeadlineExceededError,
    EdgeRuntimeError,
    InvalidInputError,
    ModelLoadError,
    ModelNotFoundError,
    QueueFullError,
    UnsupportedNodesError,
)
from edge_runtime.serving.dataplane import failure_reason


class UnauthorizedError(EdgeRuntimeError):
    """The request lacks the bearer token the server was started with."""


class TaskNotFoundError(ModelNotFoundError):
    """No async task with that id (never existed, cancelled and removed, or expired)."""


class ResponseNotFoundError(ModelNotFoundError):
    """No stored Responses API response with that id (never stored, evicted, deleted, or storing is off)."""


class TaskStateError(EdgeRuntimeError):
    """The async task has no result to give: still pending, or cancelled."""


class RequestTooLargeError(InvalidInputError):
    """The request body is larger than ``max_body_bytes``."""


@dataclass(frozen=True)
class ErrorMapping:
    status: int
    reason: str  # the ``reason`` label of nv_inference_request_failure (the data plane's ``failure_reason``)


OVERLOAD = -1  # placeholder status: the server's configured overload status

STATUS_TABLE: tuple[tuple[type[BaseException], int], ...] = (
    (QueueFullError, OVERLOAD),
    (DeadlineExceededError, 504),
    (RequestTooLargeError, 413),
    (UnsupportedNodesError, 400),
    (InvalidInputError, 400),
    (ConfigError, 400),
    (ModelLoadError, 400),
    (ModelNotFoundError, 404),
    (UnauthorizedError, 401),
    (TaskStateError, 409),
    (CloudError, 502),
    (BackendError, 503),
    (BackendUnavailableError, 503),
    (EdgeRuntimeError, 503),
)
INTERNAL = ErrorMapping(500, "OTHER")


def mapping_of(exc: BaseException, overload_status: int = 429) -> ErrorMapping:
    """Status and reason for ``exc``: the first table row it is an instance of."""
    for cls, status in STATUS_TABLE:
        if isinstance(exc, cls):
            return ErrorMapping(overload_status if status == OVERLOAD else status, failure_reason(exc))
    return INTERNAL


def error_headers(exc: BaseException, retry_after_s: int) -> dict[str, str]:
    """Headers an error response must carry: Retry-After on overload, the auth challenge on 401."""
    if isinstance(exc, QueueFullError):
        return {"Retry-After": str(retry_after_s)}
    if isinstance(exc, UnauthorizedError):
        return {"WWW-Authenticate": 'Bearer realm="edge-runtime"'}
    return {}


def error_body(message: str) -> bytes:
    """``{"error": "<message>"}``, the body of every v2 error response."""
    return json.dumps({"error": message}).encode()


# OpenAI's error ``type`` per status (what its clients show); anything else is a server_error.
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
                 405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}


def openai_error_body(message: str, status: int, code: str | None = None) -> bytes:
    """``{"error": {"message", "type", "param", "code"}}``: errors of the ``/v1/*`` routes, OpenAI's shape."""
    return json.dumps({"error": {"message": message, "type": _OPENAI_TYPES.get(status, "server_error"),
                                 "param": None, "code": code}}).encode()


# the OpenAI-compatible paths: /v1/* and vLLM's tokenizer routes
OPENAI_PATHS = ("/v1/", "/tokenize", "/detokenize")


def error_body_for(path: str, message: str, status: int) -> bytes:
    """The error body a client of ``path`` parses: OpenAI's shape on the OpenAI-compatible paths, v2's
    elsewhere."""
    return openai_error_body(message, status) if path.startswith(OPENAI_PATHS) else error_body(message)


def public_message(exc: BaseException) -> str:
    """What the client may read: the message of a family error, nothing of a bug's internals."""
    if mapping_of(exc) is INTERNAL:
        return "internal server error (see the server log)"
    return str(exc) or type(exc).__name__
