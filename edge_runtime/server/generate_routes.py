"""Triton's generate extension: ``POST /v2/models/{model}/generate`` and ``/generate_stream``.

Body: ``{"text_input": "...", "parameters": {...}}``; parameters (top-level or
under ``parameters``) are OpenAI's sampling names (``max_tokens``,
``temperature``, ``top_p``, ``seed``, ``stop``, ...). The answer is
``{"model_name", "model_version", "text_output"}``; the stream sends one such
event per chunk (``text_output`` the new text); ``"async": true`` answers 202
with a task polled through ``/v2/tasks/{id}``. Errors take the v2 routes'
``{"error": ...}`` shape through the error middleware.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from aiohttp import web

from edge_runtime.errors import InvalidInputError
from edge_runtime.generation.openai_params import parse_completion
from edge_runtime.protocol.codec import EncodedResponse
from edge_runtime.server.generation_http import generative, json_object, sse, state_of, until_disconnect
from edge_runtime.serving.layout import parse_version


def _parse(request: web.Request, body: dict[str, Any]) -> Any:
    text = body.get("text_input")
    if not isinstance(text, str):
        raise InvalidInputError("'text_input' must be a string")
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInputError("'parameters' must be an object")
    merged = {k: v for k, v in body.items() if k not in ("text_input", "parameters", "id")}
    return parse_completion({**merged, **parameters, "model": request.match_info["model"], "prompt": text})


async def _target(request: web.Request) -> Any:
    """The generative version named by the URL (its latest version unless the URL names one)."""
    loaded = await generative(request, request.match_info["model"])
    version = request.match_info.get("version")
    if version is None:
        return loaded
    return state_of(request).repository.get(loaded.name, parse_version(version))


async def generate(request: web.Request) -> web.Response:
    parsed = _parse(request, await json_object(request))
    loaded = await _target(request)
    chunks = await loaded.dispatcher.stream_completion(parsed)

    async def collect() -> str:
        return "".join([chunk.text async for chunk in chunks])

    if parsed.wants_async:  # 202 + task, polled through /v2/tasks/{id} like an async /infer
        async def work() -> EncodedResponse:
            document = {"model_name": loaded.name, "model_version": str(loaded.version), "text_output": await collect()}
            return EncodedResponse(json.dumps(document).encode())

        task = state_of(request).tasks.submit(loaded.name, str(loaded.version), work)
        return web.json_response(task.to_dict(), status=202, headers={"Location": f"/v2/tasks/{task.id}"})
    try:
        text = await until_disconnect(request, collect())
    finally:
        await chunks.aclose()
    return web.json_response({"model_name": loaded.name, "model_version": str(loaded.version), "text_output": text})


async def generate_stream(request: web.Request) -> web.StreamResponse:
    parsed = _parse(request, await json_object(request))
    loaded = await _target(request)
    chunks = await loaded.dispatcher.stream_completion(parsed)
    first = await anext(chunks)  # admission errors answer with their status, before the stream starts

    async def events() -> AsyncIterator[dict[str, Any]]:
        chunk = first
        while chunk is not None:
            if chunk.text or chunk.finish_reason:
                event = {"model_name": loaded.name, "model_version": str(loaded.version), "text_output": chunk.text}
                if chunk.finish_reason:
                    event["finish_reason"] = chunk.finish_reason
                yield event
            chunk = await anext(chunks, None)

    async def closing() -> AsyncIterator[dict[str, Any]]:
        try:
            async for event in events():
                yield event
        finally:
            await chunks.aclose()

    return await sse(request, closing(), done=False)


_M = "/v2/models/{model}"
_V = "/v2/models/{model}/versions/{version}"
GENERATE_ROUTES = tuple(row for base in (_M, _V) for row in (
    ("POST", f"{base}/generate", generate, "Triton generate extension: text in, text out", None, None, "inference"),
    ("POST", f"{base}/generate_stream", generate_stream, "Triton generate extension, as server-sent events",
     None, None, "inference"),
))
