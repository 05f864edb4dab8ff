"""vLLM's ``POST /tokenize`` and ``POST /detokenize``: a prompt's token ids without generating.

Agents count their context with them. ``/tokenize`` takes a plain ``prompt`` or chat
``messages`` (with ``tools`` and the chat rendering fields of ``chat.ChatOptions``) and answers
``{"count", "max_model_len", "tokens", "token_strs"}``: the ids a completion request would
prefill, image tokens included (a vision-language model decodes each image for its size, never
runs its encoder). ``add_special_tokens`` defaults as vLLM's do (a plain prompt: yes; messages:
no, the template places them); ``return_token_strs`` adds each id's vocabulary entry.
``/detokenize`` takes ``{"model", "tokens"}`` and answers ``{"prompt"}`` (special tokens kept, as
vLLM decodes). Errors are OpenAI error objects, as on the ``/v1`` routes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from edge_runtime.errors import EdgeRuntimeError, InvalidInputError
from edge_runtime.generation.chat import ChatOptions
from edge_runtime.generation.openai_params import image_parts, model_name
from edge_runtime.generation.structured import parse_structured
from edge_runtime.server.generation_http import dumps, generative, json_object
from edge_runtime.server.openai_routes import openai_error


def _flag(body: dict[str, Any], key: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise InvalidInputError(f"'{key}' must be true or false, got {value!r}")
    return value


async def tokenize(request: web.Request) -> web.Response:
    try:
        body = await json_object(request)
        loaded = await generative(request, model_name(body))
        messages, prompt = body.get("messages"), body.get("prompt")
        if (messages is None) == (prompt is None):
            raise InvalidInputError("give exactly one of 'prompt' (a string) and 'messages'")
        if isinstance(messages, list) and image_parts(messages) and not loaded.model.is_multimodal:
            raise InvalidInputError(f"{loaded.name} is not a multimodal model")  # vLLM's words, as chat answers
        chat = ChatOptions.from_body(body) if messages is not None else ChatOptions()
        tools = parse_structured(body, chat=True).tools if messages is not None else None
        model = loaded.model
        # a VLM decodes its images here: off the event loop
        ids = await asyncio.to_thread(model.tokenize, prompt=prompt, messages=messages,
                                      tools=list(tools.tools) if tools is not None else None, chat=chat,
                                      add_special_tokens=_flag(body, "add_special_tokens"))
        strs = [model.tokenizer.tokenizer.id_to_token(t) for t in ids] if _flag(body, "return_token_strs") else None
        return web.Response(text=dumps({"count": len(ids), "max_model_len": model.context_length, "tokens": ids,
                                        "token_strs": strs}), content_type="application/json")
    except EdgeRuntimeError as exc:
        return openai_error(exc, request)


async def detokenize(request: web.Request) -> web.Response:
    try:
        body = await json_object(request)
        loaded = await generative(request, model_name(body))
        tokens = body.get("tokens")
        vocab = loaded.model.folder.vocab_size
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                                   for t in tokens):
            raise InvalidInputError(f"'tokens' must be a list of token ids in [0, {vocab}), got {tokens!r}"[:300])
        text = loaded.model.tokenizer.decode(tokens, skip_special_tokens=False)
        return web.Response(text=dumps({"prompt": text}), content_type="application/json")
    except EdgeRuntimeError as exc:
        return openai_error(exc, request)


# (method, path, handler, summary, ok schema, body schema, tag): rows of routes.ROUTES
TOKENIZE_ROUTES = (
    ("POST", "/tokenize", tokenize, "vLLM's tokenize: a prompt's or chat's token ids (images counted, not encoded)",
     None, None, "openai"),
    ("POST", "/detokenize", detokenize, "vLLM's detokenize: token ids to text", None, None, "openai"),
)
