"""What the generation routes share: body parsing, finding the generative version, SSE, disconnects.

Only HTTP lives here; the requests themselves are parsed by
``edge_runtime.generation.openai_params`` and answered by the version's
``GenerationDispatcher``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncIterator, Awaitable, Mapping

from aiohttp import web

from edge_runtime.errors import InvalidInputError
from edge_runtime.server.errors import INTERNAL, RequestTooLargeError, error_body_for, mapping_of, public_message
from edge_runtime.serving.layout import check_model_name
from edge_runtime.server.state import STATE, ServerState

log = logging.getLogger(__name__)
DISCONNECT_POLL_S = 0.05


def state_of(request: web.Request) -> ServerState:
    return request.app[STATE]


def dumps(document: Any) -> str:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False)


def sse_event(event: Mapping[str, Any]) -> bytes:
    """One server-sent event: ``data: {json}`` and the blank line that ends it."""
    return f"data: {dumps(event)}\n\n".encode()


async def json_object(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object; InvalidInputError / RequestTooLargeError otherwise."""
    limit = state_of(request).config.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise RequestTooLargeError(f"request body is {request.content_length} bytes; the limit is {limit}")
    body = await request.read()
    try:
        document = json.loads(body) if body.strip() else None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"malformed JSON in the request: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidInputError("the request body must be a JSON object")
    return document


async def generative(request: web.Request, name: str) -> Any:
    """The served version ``name`` if it generates text (ModelNotFoundError / InvalidInputError),
    loaded first when the memory settings load on demand (``[memory] lazy_load``, or a budget
    that unloaded it): its load errors (QueueFullError while busy models hold the room) raise."""
    from edge_runtime.serving.generation_serving import GenerationDispatcher

    repository = state_of(request).repository
    await repository.ensure_loaded(check_model_name(name))
    loaded = repository.get(name)
    if not isinstance(loaded.dispatcher, GenerationDispatcher):
        raise InvalidInputError(f"model {name!r} is a tensor model, not a text generator: call "
                                f"POST /v2/models/{name}/infer")
    return loaded


def is_disconnected(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def until_disconnect(request: web.Request, work: Awaitable[Any]) -> Any:
    """Await ``work``; cancel it (its sequence with it) as soon as the client hangs up."""
    task = asyncio.ensure_future(work)
    while not task.done():
        await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if not task.done() and is_disconnected(request):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise ConnectionResetError("the client disconnected")
    return task.result()


async def sse(request: web.Request, events: AsyncIterator[Mapping[str, Any]], done: bool = True) -> web.StreamResponse:
    """Stream ``events`` as ``data: {...}`` server-sent events, then ``data: [DONE]`` when ``done``.

    A client that disconnects stops the iteration (closing ``events`` cancels its sequence).
    An error raised by ``events`` once the stream has begun (a cloud peer failing after its
    first token) cannot change the status any more: it is sent as a last event in the route's
    error shape (``{"error": {"message", ...}}`` under ``/v1/``, ``{"error": "..."}`` on v2, as
    vLLM and Triton do), followed by ``[DONE]`` when ``done``, and the response ends normally.
    """
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    try:
        async for event in events:
            if is_disconnected(request):
                break
            await response.write(sse_event(event))
        else:
            if done:
                await response.write(b"data: [DONE]\n\n")
    except (ConnectionResetError, ConnectionError):
        pass
    except Exception as exc:  # NOTE: returning an error response now would write a second one into this stream
        mapping = mapping_of(exc)
        log.log(logging.ERROR if mapping is INTERNAL else logging.WARNING, "%s %s: the stream failed after it "
                "began: %s", request.method, request.path, exc, exc_info=mapping is INTERNAL)
        error = error_body_for(request.path, public_message(exc), mapping.status).decode()
        try:
            await response.write(f"data: {error}\n\n".encode() + (b"data: [DONE]\n\n" if done else b""))
        except ConnectionError:
            pass  # the client is gone too: nobody is left to tell
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    return response
