"""OpenAI's Responses API: ``POST /v1/responses``, answered through the chat path.

The request becomes its chat-completions equivalent (``generation.responses_params``) and runs
exactly as a chat request does (templates, images, tools, constraints, reasoning, the cloud); this
module writes the answer as a Response object — output items: a ``reasoning`` item (with the
model's reasoning parser on), a ``message`` with one ``output_text`` part, ``function_call``
items — or, streamed, as the API's typed events: ``response.created``, ``response.in_progress``,
each item's ``output_item.added`` / deltas / ``output_item.done``, then ``response.completed`` (or
``response.incomplete`` when ``max_output_tokens`` cut the answer), numbered by
``sequence_number``, with no ``[DONE]``; ``response.failed`` when the answer fails after the stream
began. Responses are stored (``store``, default true) for ``previous_response_id`` and the retrieve,
``input_items`` and delete routes (``responses_store``).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, AsyncIterator, Callable, Mapping

from aiohttp import web

from edge_runtime.errors import EdgeRuntimeError, InvalidInputError
from edge_runtime.generation import reasoning, tool_parsers
from edge_runtime.generation.openai_params import OpenAIRequest, parse_chat
from edge_runtime.generation.responses_params import chat_body
from edge_runtime.generation.tool_stream import ToolStream
from edge_runtime.server.errors import INTERNAL, mapping_of, public_message
from edge_runtime.server.generation_http import dumps, json_object, state_of
from edge_runtime.server.responses_store import ResponseStore
from edge_runtime.server.openai_routes import answer_with, openai_error

log = logging.getLogger(__name__)


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesAnswer:
    """Builds the Response documents of one request (``openai_routes`` runs it; one choice)."""

    sse_done = False  # the Responses stream ends with its terminal event, no [DONE]

    def __init__(self, parsed: OpenAIRequest, loaded: Any, body: Any,
                 keep: Callable[[dict[str, Any]], Any] | None = None) -> None:
        """``keep``: stores the final Response (``responses_store``), when the request is stored."""
        self.parsed = parsed
        self.model = loaded.model
        self.name = loaded.name
        self.body = body
        self.keep = keep
        self.chat = True
        self.id = _id("resp")
        self.created = int(time.time())
        self.tool_parser = getattr(self.model, "tool_parser", "json") if parsed.structured.parses_tools else None
        self.thinks = bool(getattr(self.model, "reasoning_parser", ""))

    def response(self, status: str, output: list[dict[str, Any]], last: Any = None,
                 thought: str | None = None, error: dict[str, str] | None = None) -> dict[str, Any]:
        """The Response object; ``last``: the answer's last chunk (its usage and finish reason); ``error``:
        why a ``failed`` one failed."""
        body, params = self.body, self.parsed.params
        usage = incomplete = None
        if last is not None:
            cut = last.finish_reason == "length"
            status = "incomplete" if cut else status
            incomplete = {"reason": "max_output_tokens"} if cut else None
            usage = self._usage(last.usage, thought)
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "background": False, "error": error, "incomplete_details": incomplete,
                "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
                "model": self.name, "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
                "previous_response_id": body.get("previous_response_id"),
                "reasoning": {"effort": None, "summary": None}, "store": self.keep is not None,
                "temperature": params.temperature, "text": body.get("text") or {"format": {"type": "text"}},
                "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
                "top_p": params.top_p, "truncation": body.get("truncation") or "disabled", "usage": usage,
                "metadata": body.get("metadata") or {}}

    def _usage(self, usage: Any, thought: str | None) -> dict[str, Any] | None:
        if usage is None:
            return None
        thinking = reasoning.token_count(self.model.tokenizer.tokenizer, thought)
        return {"input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": usage.cached_tokens},
                "output_tokens": usage.completion_tokens, "output_tokens_details": {"reasoning_tokens": thinking},
                "total_tokens": usage.total_tokens}

    def whole(self, prompt_text: str, choices: list[list[Any]]) -> dict[str, Any]:
        chunks = choices[0]
        text = "".join(c.text for c in chunks)
        thought, content = reasoning.read_answer(text, "".join(c.reasoning for c in chunks),
                                                 reasoning.opens_in_prompt(prompt_text) if self.thinks else None)
        calls: list[Any] = []
        remote = [d for c in chunks for d in c.tool_calls]
        if remote:
            calls = [tool_parsers.ToolCall(c["function"]["name"], c["function"]["arguments"], c.get("id", ""))
                     for c in tool_parsers.assemble(remote)]
        elif self.tool_parser is not None and content is not None:
            content, calls = tool_parsers.parse(self.tool_parser, content)
        output = []
        if thought and self.parsed.include_reasoning:  # an empty block makes no item (nor does it streamed)
            output.append(_reasoning_item(_id("rs"), thought, "completed"))
        if content:
            output.append(_message_item(_id("msg"), content, "completed"))
        output += [_call_item(_id("fc"), call.id or tool_parsers.new_call_id(), call.name, call.arguments, "completed")
                   for call in calls]
        return self._kept(self.response("completed", output, chunks[-1], thought))

    def _kept(self, response: dict[str, Any]) -> dict[str, Any]:
        """``response`` (final), stored first when the request asked for it."""
        if self.keep is not None:
            self.keep(response)
        return response

    async def events(self, firsts: list[Any], streams: list[AsyncIterator[Any]],
                     prompt_text: str) -> AsyncIterator[dict[str, Any]]:
        """The typed event stream. A failure once it began (a cloud peer failing after its first token)
        cannot change the status any more: it ends the stream with ``response.failed`` (the Response
        with its ``error`` and the items completed so far), as OpenAI's API does."""
        items = _ItemStream(self)
        yield items.event("response.created", response=self.response("in_progress", []))
        yield items.event("response.in_progress", response=self.response("in_progress", []))
        answering = self._answer_events(items, firsts, streams, prompt_text)
        try:
            async for event in answering:
                yield event
        except Exception as exc:  # NOTE: a Response's own terminal event, not the chat routes' error shape
            mapping = mapping_of(exc)
            log.log(logging.ERROR if mapping is INTERNAL else logging.WARNING,
                    "POST /v1/responses: the stream failed after it began: %s", exc, exc_info=mapping is INTERNAL)
            code = "rate_limit_exceeded" if mapping.status == 429 else "server_error"
            failed = self.response("failed", items.done + items.cut(),
                                   error={"code": code, "message": public_message(exc)})
            yield items.event("response.failed", response=self._kept(failed))
        finally:
            await answering.aclose()  # a client gone: its sequence stops now, not when collected

    async def _answer_events(self, items: "_ItemStream", firsts: list[Any], streams: list[AsyncIterator[Any]],
                             prompt_text: str) -> AsyncIterator[dict[str, Any]]:
        thinking = reasoning.ReasoningStream(reasoning.opens_in_prompt(prompt_text)) if self.thinks else None
        tools = ToolStream(self.tool_parser) if self.tool_parser is not None else None
        chunk, rest = firsts[0], streams[0]
        thoughts = []  # all of the reasoning, sent or not (include_reasoning), for its token count
        while chunk is not None:
            last = chunk
            text, finished, thought = chunk.text, chunk.finish_reason is not None, chunk.reasoning
            if thinking is not None and not thought:  # (a cloud peer's own reasoning passes as sent)
                thought, text = thinking.parts(text, finished)
            thoughts.append(thought)
            if thought and self.parsed.include_reasoning:
                for event in items.reasoning(thought):
                    yield event
            for delta in chunk.tool_calls:  # a cloud peer's calls, as it streamed them
                for event in items.remote_call(delta):
                    yield event
            pieces = (tools.feed(text) + (tools.finish() if finished else [])) if tools is not None \
                else ([("content", text)] if text else [])
            for piece in pieces:
                for event in items.piece(piece):
                    yield event
            chunk = await anext(rest, None)
        for event in items.close():
            yield event
        terminal = self._kept(self.response("completed", items.done, last, "".join(thoughts) or None))
        yield items.event(f"response.{terminal['status']}", response=terminal)


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [_text_part(text)] if status != "in_progress" else []}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if status != "in_progress" else []}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}


class _ItemStream:
    """The stream's output items: one open at a time (reasoning, a message, or a function call), closed
    with its done events when the answer moves on to another."""

    def __init__(self, answer: ResponsesAnswer) -> None:
        self.sequence = 0
        self.done: list[dict[str, Any]] = []  # completed items, in output order
        self.open: dict[str, Any] | None = None  # the open item (its kind, id, text so far, call fields)
        self.peer_calls: set[Any] = set()  # the indexes of a cloud peer's calls opened so far

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _index(self) -> int:
        return len(self.done)

    def _opening(self, kind: str, **fields: Any) -> list[dict[str, Any]]:
        events = self.close()
        item_id = _id({"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind])
        self.open = {"kind": kind, "id": item_id, "text": "", **fields}
        if kind == "message":
            item = _message_item(item_id, "", "in_progress")
        elif kind == "reasoning":
            item = _reasoning_item(item_id, "", "in_progress")
        else:
            item = _call_item(item_id, fields["call_id"], fields["name"], "", "in_progress")
        events.append(self.event("response.output_item.added", output_index=self._index(), item=item))
        if kind == "message":
            events.append(self.event("response.content_part.added", item_id=item_id, output_index=self._index(),
                                     content_index=0, part=_text_part("")))
        return events

    def reasoning(self, piece: str) -> list[dict[str, Any]]:
        events = [] if self.open is not None and self.open["kind"] == "reasoning" else self._opening("reasoning")
        self.open["text"] += piece
        events.append(self.event("response.reasoning_text.delta", item_id=self.open["id"], output_index=self._index(),
                                 content_index=0, delta=piece))
        return events

    def piece(self, piece: tuple[Any, ...]) -> list[dict[str, Any]]:
        """One ``ToolStream`` event: content, a call's opening, or a piece of its arguments."""
        if piece[0] == "content":
            events = [] if self.open is not None and self.open["kind"] == "message" else self._opening("message")
            self.open["text"] += piece[1]
            events.append(self.event("response.output_text.delta", item_id=self.open["id"],
                                     output_index=self._index(), content_index=0, delta=piece[1], logprobs=[]))
            return events
        if piece[0] == "call":
            return self._opening("function_call", call_id=piece[2], name=piece[3])
        return self._arguments(piece[2])

    def _arguments(self, piece: str) -> list[dict[str, Any]]:
        assert self.open is not None and self.open["kind"] == "function_call"
        self.open["text"] += piece
        return [self.event("response.function_call_arguments.delta", item_id=self.open["id"],
                           output_index=self._index(), delta=piece)]

    def remote_call(self, delta: Any) -> list[dict[str, Any]]:
        """A cloud peer's chat tool-call delta: a call opens with its id and name, then arguments follow."""
        function = delta.get("function") or {}
        events = []
        if delta.get("index", 0) not in self.peer_calls:
            events = self._opening("function_call", call_id=delta.get("id") or tool_parsers.new_call_id(),
                                   name=function.get("name") or "")
            self.peer_calls.add(delta.get("index", 0))
        if function.get("arguments"):
            events += self._arguments(function["arguments"])
        return events

    def cut(self) -> list[dict[str, Any]]:
        """The open item as it stands, ``incomplete`` (the answer failed in it), or nothing."""
        item = self.open
        if item is None:
            return []
        if item["kind"] == "message":
            return [_message_item(item["id"], item["text"], "incomplete")]
        if item["kind"] == "reasoning":
            return [_reasoning_item(item["id"], item["text"], "incomplete")]
        return [_call_item(item["id"], item["call_id"], item["name"], item["text"], "incomplete")]

    def close(self) -> list[dict[str, Any]]:
        """The open item's done events; the item joins the completed output."""
        item, self.open = self.open, None
        if item is None:
            return []
        index, text = self._index(), item["text"]
        if item["kind"] == "message":
            whole = _message_item(item["id"], text, "completed")
            events = [self.event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                                 text=text, logprobs=[]),
                      self.event("response.content_part.done", item_id=item["id"], output_index=index,
                                 content_index=0, part=_text_part(text))]
        elif item["kind"] == "reasoning":
            whole = _reasoning_item(item["id"], text, "completed")
            events = [self.event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                 content_index=0, text=text)]
        else:
            whole = _call_item(item["id"], item["call_id"], item["name"], text, "completed")
            events = [self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                 name=item["name"], arguments=text)]
        events.append(self.event("response.output_item.done", output_index=index, item=whole))
        self.done.append(whole)
        return events


async def responses(request: web.Request) -> web.StreamResponse:
    try:
        body = await json_object(request)
        store = state_of(request).responses
        conversation = continued(body, store)  # previous_response_id's conversation, then this input
        parsed = parse_chat(chat_body({**{k: v for k, v in body.items() if k != "previous_response_id"},
                                       "input": conversation}))
        wanted = body.get("store", True)
        if not isinstance(wanted, bool):
            raise InvalidInputError(f"'store' must be true or false, got {wanted!r}")
        keep = (lambda response: store.put(response, conversation)) if wanted and store.enabled else None
        return await answer_with(request, parsed, lambda p, loaded: ResponsesAnswer(p, loaded, body, keep))
    except EdgeRuntimeError as exc:
        return openai_error(exc, request)


def continued(body: Mapping[str, Any], store: ResponseStore) -> list[dict[str, Any]]:
    """The request's input as items, after the stored conversation ``previous_response_id`` names
    (ResponseNotFoundError, a 404, when it is not stored)."""
    given = body.get("input")
    items = [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else given
    previous = body.get("previous_response_id")
    if previous is None:
        return items
    history = store.get(previous).conversation
    return history + (items if isinstance(items, list) else [items])  # a bad input is chat_body's 400


async def retrieve(request: web.Request) -> web.Response:
    try:
        stored = state_of(request).responses.get(request.match_info["response_id"])
        return web.Response(text=dumps(stored.response), content_type="application/json")
    except EdgeRuntimeError as exc:
        return openai_error(exc, request)


async def input_items(request: web.Request) -> web.Response:
    try:
        items = state_of(request).responses.get(request.match_info["response_id"]).input_items
        return web.Response(text=dumps({"object": "list", "data": items, "has_more": False,
                                        "first_id": items[0]["id"] if items else None,
                                        "last_id": items[-1]["id"] if items else None}),
                            content_type="application/json")
    except EdgeRuntimeError as exc:
        return openai_error(exc, request)


async def delete(request: web.Request) -> web.Response:
    try:
        response_id = request.match_info["response_id"]
        state_of(request).responses.delete(response_id)
        return web.Response(text=dumps({"id": response_id, "object": "response.deleted", "deleted": True}),
                            content_type="application/json")
    except EdgeRuntimeError as exc:
        return openai_error(exc, request)


# (method, path, handler, summary, ok schema, body schema, tag): rows of routes.ROUTES
RESPONSES_ROUTES = (
    ("POST", "/v1/responses", responses,
     "OpenAI Responses API (input items, function tools, previous_response_id; typed SSE events with stream: "
     "true)", None, None, "openai"),
    ("GET", "/v1/responses/{response_id}", retrieve, "A stored Response", None, None, "openai"),
    ("GET", "/v1/responses/{response_id}/input_items", input_items, "The conversation a stored Response "
     "answered, as input items", None, None, "openai"),
    ("DELETE", "/v1/responses/{response_id}", delete, "Forget a stored Response", None, None, "openai"),
)
