"""OpenAI-compatible routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

Handlers parse (``openai_params``), ask the version's ``GenerationDispatcher``
for chunks and write OpenAI's JSON: one object, or server-sent events
(``chat.completion.chunk`` / ``text_completion`` chunks, ``data: [DONE]``,
a final usage chunk with ``stream_options.include_usage``). Errors come back
in OpenAI's error object, ``{"error": {"message", "type", "param", "code"}}``,
with the status of the server's one error table. ``"async": true`` answers
202 with a task polled through ``/v2/tasks/{id}``.

Structured output and tools (``generation.structured``): the request's grammar
is compiled before it is queued (a bad one is a 400 before any token); with
tools offered, the answer is read in the model's tool-call format
(``tool_parsers``) into ``message.tool_calls`` and ``finish_reason:
"tool_calls"``, and a stream sends each call as OpenAI does (``tool_stream``).
A cloud peer's own tool-call deltas pass through as it sent them.

Reasoning (``[generation] reasoning_parser``, ``generation.reasoning``): a chat answer's
``<think>`` part goes to ``message.reasoning_content`` and ``message.reasoning`` (vLLM's old and new
names; its deltas likewise), tool calls are read from the rest, and ``include_reasoning: false``
drops it. A cloud peer's own reasoning deltas pass through.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from typing import Any, AsyncIterator, Awaitable, Callable

from aiohttp import web

from edge_runtime.errors import EdgeRuntimeError, InvalidInputError, ModelNotFoundError
from edge_runtime.generation import reasoning, tool_parsers
from edge_runtime.generation.openai_params import OpenAIRequest, parse_chat, parse_completion
from edge_runtime.generation.tool_stream import ToolStream
from edge_runtime.protocol.codec import EncodedResponse
from edge_runtime.server.errors import error_headers, mapping_of, openai_error_body, public_message
from edge_runtime.server.generation_http import dumps, generative, json_object, sse, state_of, until_disconnect

def openai_error(exc: BaseException, request: web.Request) -> web.Response:
    config = state_of(request).config
    status = mapping_of(exc, config.overload_status).status
    code = "model_not_found" if isinstance(exc, ModelNotFoundError) else (
        "context_length_exceeded" if "context" in str(exc) and status == 400 else None)
    return web.Response(status=status, body=openai_error_body(public_message(exc), status, code),
                        content_type="application/json",
                        headers=error_headers(exc, config.retry_after_s))


def _logprobs_chat(model: Any, chunk: Any) -> list[dict[str, Any]]:
    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = model.tokenizer.token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return [{**entry(c.token, c.logprob), "top_logprobs": [entry(t, lp) for t, lp in c.top]} for c in chunk.logprobs]


class _Answer:
    """Builds the OpenAI documents of one request, chat or completion."""

    def __init__(self, parsed: OpenAIRequest, loaded: Any) -> None:
        self.parsed = parsed
        self.chat = parsed.messages is not None
        self.model = loaded.model
        self.name = loaded.name
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        # the tool-call format the answer is read in (None: tools not offered, or tool_choice none)
        self.tool_parser = getattr(self.model, "tool_parser", "json") if parsed.structured.parses_tools else None
        # the answer's <think> part is read apart (chat only, with the model's reasoning parser on)
        self.thinks = self.chat and bool(getattr(self.model, "reasoning_parser", ""))
        self.thought_tokens = 0  # all choices' reasoning tokens, for usage (read once the answer is whole)

    def envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.name, "choices": choices}

    def logprobs(self, chunks: list[Any]) -> dict[str, Any] | None:
        if not self.parsed.params.logprobs:
            return None
        if self.chat:
            return {"content": [e for c in chunks for e in _logprobs_chat(self.model, c)]}
        choices = [c for chunk in chunks for c in chunk.logprobs]
        text = self.model.tokenizer.token_text
        tops: list[Any] = [{text(t): lp for t, lp in c.top} for c in choices]
        prompt = chunks[0].prompt_logprobs if self.parsed.echo else None
        if prompt:  # the legacy echo: the prompt's tokens first, the first one unscored (OpenAI's null)
            tops = [None] + [{text(t): lp for t, lp in c.top} for c in prompt[1:]] + tops
            choices = list(prompt) + choices
        return {"tokens": [text(c.token) for c in choices], "token_logprobs": [c.logprob for c in choices],
                "top_logprobs": tops, "text_offset": []}

    def prompt_logprobs(self, chunks: list[Any]) -> list[Any] | None:
        """vLLM's ``prompt_logprobs`` of a choice: per prompt token (null for the first), the token and its
        alternatives by id: logprob, rank, decoded text."""
        scored = chunks[0].prompt_logprobs if chunks else None
        if scored is None:
            return None
        text = self.model.tokenizer.token_text

        def entry(choice: Any) -> dict[str, Any]:
            ranked = {str(t): {"logprob": lp, "rank": i + 1, "decoded_token": text(t)}
                      for i, (t, lp) in enumerate(choice.top)}
            ranked[str(choice.token)] = {"logprob": choice.logprob, "rank": choice.rank,
                                         "decoded_token": text(choice.token)}
            return ranked

        return [None] + [entry(c) for c in scored[1:]]

    def whole(self, prompt_text: str, choices: list[list[Any]]) -> dict[str, Any]:
        """The whole answer of ``choices`` (each choice's chunks, in choice order)."""
        documents = [self._whole_choice(index, prompt_text, chunks) for index, chunks in enumerate(choices)]
        return {**self.envelope(documents, chunk=False), "usage": self._usage([chunks[-1] for chunks in choices])}

    def _usage(self, lasts: list[Any]) -> dict[str, Any]:
        usage = _usage(lasts)
        if self.thinks:  # OpenAI's place for them; counted by encoding each choice's reasoning
            usage["completion_tokens_details"] = {"reasoning_tokens": self.thought_tokens}
        return usage

    def _whole_choice(self, index: int, prompt_text: str, chunks: list[Any]) -> dict[str, Any]:
        last = chunks[-1]
        text = "".join(c.text for c in chunks)
        if self.chat:
            thought, content = reasoning.read_answer(text, "".join(c.reasoning for c in chunks),
                                                     reasoning.opens_in_prompt(prompt_text) if self.thinks else None)
            if self.thinks:
                self.thought_tokens += reasoning.token_count(self.model.tokenizer.tokenizer, thought)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            reason = last.finish_reason
            remote = [d for c in chunks for d in c.tool_calls]
            if remote:  # a cloud peer answered with tool calls: passed on as it made them
                message = {"role": "assistant", "content": content or None,
                           "tool_calls": tool_parsers.assemble(remote)}
            elif self.tool_parser is not None and content is not None:
                content, calls = tool_parsers.parse(self.tool_parser, content)
                if calls:
                    message = {"role": "assistant", "content": content,
                               "tool_calls": [c.to_dict() for c in calls]}
                    reason = "tool_calls" if reason == "stop" else reason
            if thought is not None and self.parsed.include_reasoning:
                message.update(_reasoning_fields(thought))
            choice = {"index": index, "message": message, "finish_reason": reason, "logprobs": self.logprobs(chunks)}
        else:
            choice = {"index": index, "text": (prompt_text if self.parsed.echo else "") + text,
                      "finish_reason": last.finish_reason, "logprobs": self.logprobs(chunks)}
        if (self.parsed.body or {}).get("prompt_logprobs") is not None:  # asked for by name (vLLM's field)
            choice["prompt_logprobs"] = self.prompt_logprobs(chunks)
        return choice

    async def events(self, firsts: list[Any], streams: list[AsyncIterator[Any]],
                     prompt_text: str) -> AsyncIterator[dict[str, Any]]:
        """The stream's events: each choice's deltas as they come (one choice's in order), then the
        usage of all when asked for."""
        usage_field = {"usage": None} if self.parsed.include_usage else {}
        lasts = list(firsts)

        async def choice_events(index: int) -> AsyncIterator[dict[str, Any]]:
            async for choice in self._choice_events(index, firsts[index], streams[index], prompt_text, lasts):
                yield choice

        merged = _merged([choice_events(i) for i in range(len(firsts))])
        try:
            async for choice in merged:
                yield {**self.envelope([choice], True), **usage_field}
        finally:
            await merged.aclose()  # its reads of the streams stop before the streams are closed
        if self.parsed.include_usage and all(last.usage is not None for last in lasts):
            yield {**self.envelope([], True), "usage": self._usage(lasts)}

    async def _choice_events(self, index: int, first: Any, rest: AsyncIterator[Any], prompt_text: str,
                             lasts: list[Any]) -> AsyncIterator[dict[str, Any]]:
        """Choice ``index``'s stream entries; its last chunk is left in ``lasts[index]``."""
        if self.chat:
            yield {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                   "finish_reason": None}
        elif self.parsed.echo:
            yield {"index": index, "text": prompt_text, "logprobs": None, "finish_reason": None}
        tools = ToolStream(self.tool_parser) if self.chat and self.tool_parser is not None else None
        thinking = reasoning.ReasoningStream(reasoning.opens_in_prompt(prompt_text)) if self.thinks else None
        thoughts: list[str] = []  # this choice's reasoning, sent or not, for usage
        called = False
        chunk = first
        while chunk is not None:
            lasts[index] = chunk
            text, reason, thought = chunk.text, chunk.finish_reason, chunk.reasoning
            if thinking is not None and not thought:  # (a cloud peer's own reasoning passes as sent)
                thought, text = thinking.parts(text, reason is not None)
            thoughts.append(thought)
            if self.thinks and reason is not None:  # its last chunk: before the usage event is built
                self.thought_tokens += reasoning.token_count(self.model.tokenizer.tokenizer, "".join(thoughts))
            thought = thought if self.parsed.include_reasoning else ""
            if tools is not None:
                if thought:  # before the calls the same chunk may open
                    yield {"index": index, "delta": _reasoning_fields(thought), "logprobs": None,
                           "finish_reason": None}
                    thought = ""
                events = tools.feed(text) + (tools.finish() if reason is not None else [])
                called = called or any(e[0] == "call" for e in events)
                for delta in _tool_deltas(events):
                    yield {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
                text = ""
                reason = "tool_calls" if called and reason == "stop" else reason
            if text or thought or reason or chunk.logprobs or chunk.tool_calls:
                delta: dict[str, Any] = _reasoning_fields(thought) if thought else {}
                if text:
                    delta["content"] = text
                if chunk.tool_calls:
                    delta["tool_calls"] = [dict(c) for c in chunk.tool_calls]
                choice = ({"index": index, "delta": delta} if self.chat else {"index": index, "text": text})
                choice["logprobs"] = self.logprobs([chunk])
                choice["finish_reason"] = reason
                yield choice
            chunk = await anext(rest, None)


def _reasoning_fields(text: str) -> dict[str, str]:
    """A message's or delta's reasoning under both of vLLM's names (``reasoning_content`` before 0.11,
    ``reasoning`` since; DeepSeek's API and SGLang use the first)."""
    return {"reasoning_content": text, "reasoning": text}


def _usage(lasts: list[Any]) -> dict[str, Any]:
    """One request's usage from its choices' last chunks: the prompt counted once (with the first
    choice's cached tokens), the completions of all choices summed."""
    usage = lasts[0].usage.to_dict()
    if len(lasts) > 1:
        completion = sum(last.usage.completion_tokens for last in lasts)
        usage.update(completion_tokens=completion, total_tokens=usage["prompt_tokens"] + completion)
    return usage


async def _merged(generators: list[AsyncIterator[Any]]) -> AsyncIterator[Any]:
    """The items of several async iterators as each comes, every one's own order kept (asyncio has no
    merge of async iterators, and one extra dependency for these lines is not worth it)."""
    if len(generators) == 1:
        async for item in generators[0]:
            yield item
        return
    pending = {asyncio.ensure_future(anext(g)): g for g in generators}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in [t for t in pending if t in done]:
                generator = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(anext(generator))] = generator
                yield item
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def _tool_deltas(events: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """OpenAI chat deltas of ``ToolStream`` events: content, a call's opening (id, name), argument pieces."""
    deltas = []
    for event in events:
        if event[0] == "content":
            deltas.append({"content": event[1]})
        elif event[0] == "call":
            deltas.append({"tool_calls": [{"index": event[1], "id": event[2], "type": "function",
                                           "function": {"name": event[3], "arguments": ""}}]})
        else:
            deltas.append({"tool_calls": [{"index": event[1], "function": {"arguments": event[2]}}]})
    return deltas


async def _answer(request: web.Request, parsed: OpenAIRequest) -> web.StreamResponse:
    return await answer_with(request, parsed, _Answer)


async def answer_with(request: web.Request, parsed: OpenAIRequest,
                      make_answer: Callable[[OpenAIRequest, Any], Any]) -> web.StreamResponse:
    """Run ``parsed`` and write its answer as ``make_answer(parsed, loaded)`` builds it (``_Answer``:
    chat and completions; ``responses_routes.ResponsesAnswer``: the Responses API)."""
    loaded = await generative(request, parsed.model)
    # NOTE: no await from here until the model is held busy (dispatcher.hold or dispatcher.stream): the budget
    # cannot unload it between.
    if parsed.wants_async and parsed.stream:
        raise InvalidInputError("'async' and 'stream' cannot be combined")
    answer = make_answer(parsed, loaded)
    multimodal = getattr(loaded.model, "is_multimodal", False)
    structured = parsed.structured
    release = None  # set once the model is held busy before its stream exists
    if (structured.guide is not None or structured.parses_tools) and not (parsed.images and not multimodal):
        # compiled (cached per grammar) before the request is queued: a bad schema is a 400 before any token;
        # a thinking model's grammar holds after its reasoning (vLLM's structured output with a reasoning parser)
        after = loaded.model.reasoning_start(parsed.chat) if answer.thinks else ""
        params, release = await loaded.dispatcher.constrained(structured, parsed.params, after)
        parsed = replace(parsed, params=params)
    try:
        return await _route(request, parsed, loaded, answer, multimodal, release)
    except BaseException:
        if release is not None:
            release()  # idempotent: a stream that took it has released it already
        raise


async def _route(request: web.Request, parsed: OpenAIRequest, loaded: Any, answer: Any, multimodal: bool,
                 release: Any) -> web.StreamResponse:
    """``_answer`` after the request's grammars are compiled: to the cloud, through a VLM's image work,
    or straight to the batcher; then streamed, collected or submitted as a task. ``n`` choices are
    ``n`` sequences of the one prompt (prepared once: a VLM's images are encoded once)."""
    structured = parsed.structured
    tools = list(structured.tools.tools) if structured.tools is not None else None
    choices = [parsed.choice(i) for i in range(parsed.n)]
    if parsed.n > 1 and getattr(loaded.model, "backend", None) == "onnxruntime-genai":
        raise InvalidInputError(f"'n' must be 1 for {parsed.model}: onnxruntime-genai runs it, one sequence at a time")
    settings = getattr(loaded.model, "settings", None)
    if settings is not None and parsed.n > settings.max_batch_size + settings.max_queue:
        # more choices than the model ever holds at once: a 429 would invite retries that cannot succeed
        raise InvalidInputError(f"'n' ({parsed.n}) is more choices than {parsed.model} can hold at once "
                                f"(max_batch_size {settings.max_batch_size} + max_queue {settings.max_queue})")
    if parsed.images and not multimodal:
        if not loaded.dispatcher.forwards:  # vLLM's words: agent clients match them to strip images and retry
            raise InvalidInputError(f"{parsed.model} is not a multimodal model")
        prepared_text = ""
        streams = [loaded.dispatcher.stream_remote(c.params, c) for c in choices]  # busy from here, as below
    elif multimodal:
        if parsed.truncate is not None:  # image features and positions are the prompt's own: nothing to cut
            raise InvalidInputError("'truncate_prompt_tokens' is not supported by vision-language models")
        # A VLM decodes, preprocesses and encodes the images in prepare: up to seconds of work that must
        # not block the event loop, with the model held busy (not unloadable) from before it starts.
        release = release or loaded.dispatcher.hold()

        def prepare() -> Awaitable[Any]:
            return asyncio.to_thread(loaded.model.prepare, prompt=parsed.prompt, messages=parsed.messages,
                                     tools=tools, chat=parsed.chat)

        try:
            # With a [cloud] peer the route is chosen before that work (an image sent to the cloud costs
            # nothing here); one streamed choice only: an async task or an echo must have the prompt up
            # front, and several choices share one prepared prompt.
            estimate = (await asyncio.to_thread(loaded.model.estimate, prompt=parsed.prompt,
                                                messages=parsed.messages, tools=tools, chat=parsed.chat)
                        if loaded.dispatcher.forwards and not parsed.wants_async and not parsed.echo
                        and parsed.n == 1 else None)
            prepared = None if estimate is not None else await prepare()
        except BaseException:
            release()
            raise
        if prepared is None:
            prepared_text = ""  # chat (no echo): the prompt text is never sent back
            streams = [loaded.dispatcher.stream_deferred(prepare, estimate, parsed.params, parsed, release)]
        else:
            prepared_text = prepared.text
            streams = [loaded.dispatcher.stream(prepared, c.params, c, release=release if i == 0 else None)
                       for i, c in enumerate(choices)]
    else:
        prepared = loaded.model.prepare(prompt=parsed.prompt, messages=parsed.messages, tools=tools, chat=parsed.chat)
        if parsed.truncate is not None:
            prepared = loaded.model.truncated(prepared, parsed.truncate)
        prepared_text = prepared.text
        # busy from here (or since the grammar's compile): close them on every path
        streams = [loaded.dispatcher.stream(prepared, c.params, c, release=release if i == 0 else None)
                   for i, c in enumerate(choices)]
    if parsed.wants_async:
        return _submit_task(request, loaded, answer, streams, prepared_text)
    try:
        firsts = await _first_chunks(streams)  # admission errors (429, 400) surface before any byte is sent
    except BaseException:
        await _close(streams)
        raise
    if parsed.stream:
        events = answer.events(firsts, streams, prepared_text)
        try:
            return await sse(request, events, done=getattr(answer, "sse_done", True))
        finally:
            await events.aclose()  # no read of a stream left in flight (several choices read concurrently)
            await _close(streams)  # a client gone mid-stream: its sequences are cancelled now, not at GC

    async def collect(first: Any, chunks: AsyncIterator[Any]) -> list[Any]:
        collected = [first]
        async for chunk in chunks:
            collected.append(chunk)
        return collected

    try:
        collected = await until_disconnect(request, asyncio.gather(
            *(collect(first, chunks) for first, chunks in zip(firsts, streams))))
    finally:
        await _close(streams)
    return web.Response(text=dumps(answer.whole(prepared_text, collected)), content_type="application/json")


async def _first_chunks(streams: list[Any]) -> list[Any]:
    """Each stream's first chunk. The first choice's comes first, then the others' together: its prompt
    is then in the prefix cache, so the other choices prefill only what the cache's blocks leave."""
    first = await anext(streams[0])
    if len(streams) == 1:
        return [first]
    rest = await asyncio.gather(*(anext(s) for s in streams[1:]), return_exceptions=True)
    for result in rest:
        if isinstance(result, BaseException):
            raise result
    return [first, *rest]


async def _close(streams: list[Any]) -> None:
    for chunks in streams:
        await chunks.aclose()


def _submit_task(request: web.Request, loaded: Any, answer: _Answer, streams: list[Any],
                 prompt_text: str) -> web.Response:
    async def collect(chunks: AsyncIterator[Any]) -> list[Any]:
        return [chunk async for chunk in chunks]

    async def work() -> EncodedResponse:
        try:
            collected = await asyncio.gather(*(collect(chunks) for chunks in streams))
        finally:
            await _close(streams)
        return EncodedResponse(dumps(answer.whole(prompt_text, list(collected))).encode())

    task = state_of(request).tasks.submit(loaded.name, str(loaded.version), work)
    return web.Response(status=202, text=dumps(task.to_dict()), content_type="application/json",
                        headers={"Location": f"/v2/tasks/{task.id}"})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    try:
        return await _answer(request, parse_chat(await json_object(request)))
    except EdgeRuntimeError as exc:
        return openai_error(exc, request)


async def completions(request: web.Request) -> web.StreamResponse:
    try:
        return await _answer(request, parse_completion(await json_object(request)))
    except EdgeRuntimeError as exc:
        return openai_error(exc, request)


async def list_models(request: web.Request) -> web.Response:
    """Served generative models (with their context length); when models load on demand, also those
    on disk that a request would load (``"loaded": false``, no context length until loaded)."""
    from edge_runtime.serving.generation_serving import GenerationDispatcher

    repository = state_of(request).repository
    served = [v for v in repository.served() if isinstance(v.dispatcher, GenerationDispatcher)]
    latest = {v.name: v for v in served}  # served() is sorted by version: the last one wins
    # the context length under both names clients read: ours and vLLM's ``max_model_len``
    entries = {name: {"id": name, "object": "model", "created": 0, "owned_by": "edge-runtime",
                      "context_length": v.model.context_length, "max_model_len": v.model.context_length,
                      "loaded": True} for name, v in latest.items()}
    if repository.loads_on_demand:
        for name in repository.generative_on_disk():
            if name not in entries and not repository.versions_served(name):
                entries[name] = {"id": name, "object": "model", "created": 0, "owned_by": "edge-runtime",
                                 "loaded": False}
    data = [entries[name] for name in sorted(entries)]
    return web.Response(text=dumps({"object": "list", "data": data}), content_type="application/json")


# (method, path, handler, summary, ok schema, body schema, tag): rows of routes.ROUTES
OPENAI_ROUTES = (
    ("POST", "/v1/chat/completions", chat_completions,
     "OpenAI chat completions (SSE with stream: true; async: true answers 202 with a task)", None, None, "openai"),
    ("POST", "/v1/completions", completions, "OpenAI completions (plain prompt)", None, None, "openai"),
    ("GET", "/v1/models", list_models, "Generative models served, and those a request would load (OpenAI list)",
     None, None, "openai"),
)
