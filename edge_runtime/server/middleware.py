"""Request middlewares: the bearer token check, and errors -> ``{"error": ...}`` responses (OpenAI's shape on /v1)."""

from __future__ import annotations

import asyncio
import hmac
import logging

from aiohttp import web

from edge_runtime.server.errors import UnauthorizedError, error_body_for, error_headers, mapping_of, public_message
from edge_runtime.server.routes import Handler, is_public

log = logging.getLogger(__name__)

Middleware = web.middleware


def error_middleware(overload_status: int, retry_after_s: int) -> Middleware:
    """Turn every raised error into JSON with the table's status; a bug becomes a logged 500."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            # aiohttp's own errors (unknown route 404, 405, body over client_max_size 413)
            headers = {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}
            return web.Response(status=exc.status, body=error_body_for(request.path, exc.text or exc.reason, exc.status),
                                content_type="application/json", headers=headers)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            mapping = mapping_of(exc, overload_status)
            if mapping.status >= 500:
                log.log(logging.ERROR if mapping.status == 500 else logging.WARNING,
                        "%s %s -> %d: %s", request.method, request.path, mapping.status, exc,
                        exc_info=mapping.status == 500)
            return web.Response(status=mapping.status, body=error_body_for(request.path, public_message(exc), mapping.status),
                                content_type="application/json", headers=error_headers(exc, retry_after_s))

    return errors


def auth_middleware(token: str | None) -> Middleware:
    """Require ``Authorization: Bearer <token>`` on every route but health, when a token is set."""
    expected = f"Bearer {token}".encode() if token else None

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is not None and not is_public(request.path):
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):  # constant time: no timing oracle on the token
                raise UnauthorizedError("missing or wrong bearer token: send 'Authorization: Bearer <token>'")
        return await handler(request)

    return auth
