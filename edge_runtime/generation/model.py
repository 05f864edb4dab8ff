"""``GenerativeModel``: the embedded API of a decoder LLM folder (``Runtime.load(folder)``).

    model = Runtime().load("qwen2-0.5b-onnx/")
    result = model.generate(messages=[{"role": "user", "content": "hi"}], max_tokens=32)
    result.text, result.usage.completion_tokens
    async for chunk in model.stream(prompt="Once", max_tokens=16):
        print(chunk.text, end="")

Every request goes through the model's ``ContinuousBatcher`` (its own thread),
so concurrent callers share decode steps. ``generate`` defaults to greedy
decoding (``temperature=0``); the OpenAI routes default to OpenAI's 1.0.

A vision-language folder (``generation.vision``) takes images too::

    model.generate(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}},
        {"type": "image", "image": pil_image_or_bytes_or_path},
        {"type": "text", "text": "What is on the screen?"}]}])
    model.generate(prompt="Describe it.", images=[Path("shot.png")])

Images are decoded, preprocessed and encoded in ``prepare``, on the caller's
thread (``stream`` runs it in a worker thread), before the request is queued.

Structured output and tools take OpenAI's request fields (``structured``)::

    model.generate(messages=..., response_format={"type": "json_schema", "json_schema": {
        "name": "tap", "schema": {...}}})
    result = model.generate(messages=..., tools=[{"type": "function", "function": {...}}],
                            tool_choice="required")
    result.tool_calls[0].name, json.loads(result.tool_calls[0].arguments)
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, Mapping, Sequence

from edge_runtime.errors import InvalidInputError
from edge_runtime.generation.chat import DEFAULT_CHAT, ChatOptions
from edge_runtime.generation.prepared import PreparedPrompt, PromptEstimate, RequestTimings, request_timings
from edge_runtime.generation.sampling import SamplingParams, TokenChoice, logit_bias_of
from edge_runtime.generation.sequence import Chunk, Usage
from edge_runtime.generation.settings import GenerationSettings
from edge_runtime.generation.structured import STRUCTURED_FIELDS

if TYPE_CHECKING:
    from edge_runtime.generation.vision.encoder import VisionLoader
    from edge_runtime.generation.vision.settings import VisionSettings

__all__ = ["GenerationResult", "GenerativeModel", "PreparedPrompt", "RequestTimings", "load_generative",
           "sampling_params"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationResult:
    text: str
    finish_reason: str
    usage: Usage
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenChoice, ...] = ()
    time_to_first_token_s: float | None = None
    elapsed_s: float = 0.0
    timings: RequestTimings | None = None
    tool_calls: tuple[Any, ...] = ()  # tool_parsers.ToolCall, when tools were offered and called
    content: str | None = None  # the text outside the reasoning and tool calls (``text`` when there are none)
    reasoning: str | None = None  # a chat answer's <think> part, with [generation] reasoning_parser on
    prompt_logprobs: tuple[TokenChoice, ...] | None = None  # with prompt_logprobs: each prompt token scored


@dataclass
class _Collected:
    texts: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    logprobs: list[TokenChoice] = field(default_factory=list)
    prompt_logprobs: tuple[TokenChoice, ...] | None = None

    def add(self, chunk: Chunk) -> None:
        if chunk.prompt_logprobs is not None:
            self.prompt_logprobs = chunk.prompt_logprobs
        self.texts.append(chunk.text)
        self.ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs)


class _Gathered:
    """``generate``'s sink: gathers the chunks on the batcher thread and wakes the caller once, at the
    last. A queue read per token woke the caller at every step, and each time the woken thread took
    the GIL the batcher's next step was waiting for (``tools/bench_token_loop.py``: ~0.2 ms of a
    ~5 ms step in the hand-off alone on 2 cores)."""

    def __init__(self) -> None:
        self.collected = _Collected()
        self.first_at: float | None = None  # perf_counter of the first chunk that carried tokens
        self.last: Chunk | None = None
        self.done = threading.Event()

    def __call__(self, chunk: Chunk) -> None:
        if self.first_at is None and chunk.token_ids:
            self.first_at = time.perf_counter()
        self.collected.add(chunk)
        if chunk.finish_reason is not None:
            self.last = chunk
            self.done.set()


def sampling_params(**kwargs: Any) -> SamplingParams:
    """SamplingParams from keyword arguments; ``stop`` may be one string; unknown names are an error."""
    known = set(SamplingParams.__dataclass_fields__)
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise InvalidInputError(f"unknown generation parameter(s) {unknown}; known: {sorted(known)}")
    stop = kwargs.get("stop")
    if isinstance(stop, str):
        kwargs["stop"] = (stop,)
    elif isinstance(stop, list):
        kwargs["stop"] = tuple(stop)
    elif stop is None:
        kwargs.pop("stop", None)
    if "logit_bias" in kwargs:
        kwargs["logit_bias"] = logit_bias_of(kwargs["logit_bias"])
    if isinstance(kwargs.get("stop_token_ids"), list):
        kwargs["stop_token_ids"] = tuple(kwargs["stop_token_ids"])
    return SamplingParams(**kwargs)


class GenerativeModel:
    """A loaded decoder: tokenizer, engine, prefix cache, batcher. ``close`` stops it."""

    backend = "cpu"
    inputs: list[Any] = []
    outputs: list[Any] = []

    def __init__(self, name: str, path: Path, settings: GenerationSettings | None = None, *,
                 threads: int = 1, vision: "VisionSettings | None" = None,
                 vision_loader: "VisionLoader | None" = None, cache_dir: Path | None = None) -> None:
        """``vision``: a VLM folder's ``[vision]`` settings; ``vision_loader``: how its vision encoder
        is loaded (``Runtime.load``-like; default an ONNX Runtime CPU session); ``cache_dir``: where an
        optimum export's fused rebuild is kept (``fused_exports``; default ``$EDGE_RUNTIME_CACHE``)."""
        from edge_runtime.generation.batcher import ContinuousBatcher
        from edge_runtime.generation.chat import ChatTokenizer
        from edge_runtime.generation.engine import DecoderEngine
        from edge_runtime.generation.fused_exports import text_decoder
        from edge_runtime.generation.prefix_cache import PrefixCache

        from edge_runtime.generation.folder import is_genai_folder
        from edge_runtime.generation.vision.folder import is_vlm_folder

        self.name = name
        self.path = Path(path)
        self.settings = settings or GenerationSettings()
        self.tokenizer = ChatTokenizer(self.path)
        self.engine = None
        self.vlm = None  # a vision-language folder's description (VLMFolder)
        from edge_runtime.generation.vision.stats import VisionStats

        self.vision_stats = VisionStats()  # image work of the requests (``/metrics``)
        self.prompter = None  # and what prepares its requests with images (VisionPrompter)
        threads = self.settings.threads or threads
        genai, own = is_genai_folder(self.path), None  # own: a genai folder's text decoder, for our engine
        if genai:
            from edge_runtime.generation.folder import engine_genai_decoder

            own, why = engine_genai_decoder(self.path, self.settings.genai_runtime)
            if own is None:
                log.info("generative model %s: onnxruntime-genai runs it: %s", name, why)
        if genai and own is None:  # onnxruntime-genai owns model and KV: no prefix cache of ours
            from edge_runtime.generation.genai_engine import GenaiBatcher, read_genai_folder

            self.backend = "onnxruntime-genai"
            self.folder = read_genai_folder(self.path)
            self.prefix_cache = PrefixCache(self.settings.prefix_block_tokens, 0)
            self.batcher = GenaiBatcher(self.folder, self.settings, self.tokenizer.decode)
            # -- onnxruntime-genai VLM (a "vision" section): images through genai's processor (genai_vision) --
            from edge_runtime.generation.genai_vision import genai_prompter

            self.prompter = genai_prompter(self.batcher, self.folder.model_type, self.tokenizer, vision)
        else:
            from edge_runtime.generation.footprint import kv_positions

            if is_vlm_folder(self.path):
                from edge_runtime.generation.vision.loading import load_vision_parts

                parts = load_vision_parts(self.path, self.settings, vision, self.tokenizer, threads=threads,
                                          loader=vision_loader, cache_dir=cache_dir)
                self.vlm, self.folder, self.engine = parts.folder, parts.folder.decoder, parts.engine
                self.prompter = parts.prompter
            else:
                if own is None:
                    own, why = text_decoder(self.path, self.settings, cache_dir)
                    log.info("generative model %s: %s", name, why)
                self.folder = own
                self.engine = DecoderEngine(self.folder, threads=threads, max_batch=self.settings.max_batch_size,
                                            flush_denormals=self.settings.flush_denormals,
                                            max_len=kv_positions(self.folder, self.settings))
            self.prefix_cache = PrefixCache(self.settings.prefix_block_tokens, self.settings.prefix_cache_bytes,
                                            _prefix_store(self.folder, self.settings, threads, cache_dir))
            self.batcher = ContinuousBatcher(self.engine, self.settings, self.prefix_cache,
                                             frozenset(self.folder.eos_token_ids), self.tokenizer.decode)
        if self.engine is not None:  # onnxruntime-genai runs its own sampling: no masks of ours
            from edge_runtime.generation.constraints import GrammarCache

            self.batcher.grammars = GrammarCache(self.tokenizer.tokenizer.to_str, self.folder.vocab_size,
                                                 self.folder.eos_token_ids)
        from edge_runtime.generation.tool_parsers import default_parser

        self.tool_parser = self.settings.tool_parser or default_parser(self.tokenizer.template_source)
        self.reasoning_parser = self.settings.reasoning_parser  # "" = off (generation.reasoning)
        self.batcher.start()
        log.info("generative model %s on %s: %s, %d layers, context %d, KV %d B/token", name, self.backend,
                 self.folder.model_type or "decoder", self.folder.kv.layers, self.batcher.max_len,
                 self.folder.kv.bytes_per_token)
        _log_quantization(name, self.path)

    @property
    def context_length(self) -> int:
        return self.batcher.max_len

    @property
    def backend_nodes(self) -> dict[str, int]:
        return {}

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of the decode batch's preallocated KV buffers (0 on onnxruntime-genai, which owns its own)."""
        return self.engine.kv.nbytes if self.engine is not None else 0

    @property
    def grammars(self) -> Any:
        """The model's ``constraints.GrammarCache`` (None: it cannot constrain its output)."""
        return getattr(self.batcher, "grammars", None)

    def structure(self, fields: Mapping[str, Any], params: SamplingParams, chat: bool = True,
                  options: ChatOptions = DEFAULT_CHAT) -> tuple[Any, Any]:
        """(Structured, params with its compiled guide) of OpenAI's structured-output fields; a chat
        request's guide holds after the reasoning of a model with a reasoning parser."""
        from edge_runtime.generation.structured import parse_structured, resolve

        structured = parse_structured(fields, chat)
        guided = structured.guide is not None or structured.parses_tools
        after = self.reasoning_start(options) if chat and guided else ""
        return structured, resolve(structured, params, self.grammars, self.tool_parser, after)

    def reasoning_start(self, options: ChatOptions = DEFAULT_CHAT) -> str:
        """How a chat answer's reasoning starts with these rendering options (``GrammarSpec.after_reasoning``):
        "open" when the template opens <think> itself, "optional" when the answer may open it, "" when the
        model has no reasoning parser or constrains its reasoning too (``structured_in_reasoning``). Read
        from a one-message render: the template, not the messages, decides (an assistant message continued
        after its own <think> aside)."""
        if not self.reasoning_parser or self.settings.structured_in_reasoning:
            return ""
        from dataclasses import replace as replaced

        from edge_runtime.generation.reasoning import opens_in_prompt

        probe = replaced(options, continue_final_message=False, add_generation_prompt=True)
        try:
            text = self.tokenizer.render([{"role": "user", "content": "."}], options=probe)
        except InvalidInputError:  # no template, or one that wants more: the answer may open the block
            return "optional"
        return "open" if opens_in_prompt(text) else "optional"

    @property
    def is_multimodal(self) -> bool:
        """Whether the model takes images (a vision-language folder)."""
        return self.prompter is not None

    # -- requests ---------------------------------------------------------------------
    def prepare(self, prompt: str | Sequence[int] | None = None,
                messages: Sequence[Mapping[str, Any]] | None = None,
                images: Sequence[Any] | None = None, tools: Sequence[Any] | None = None,
                chat: ChatOptions = DEFAULT_CHAT) -> PreparedPrompt:
        """Token ids of a plain prompt (text or ids) or of chat messages rendered by the template.

        A VLM also takes image parts in ``messages`` and ``images`` beside a text ``prompt``, and
        does all image work here (blocking). InvalidInputError for bad input, images to a model
        that reads text only included. ``tools``: OpenAI tool definitions for the chat template;
        ``chat``: how the messages are rendered (``ChatOptions``: template variables, an open final
        message).
        """
        if (prompt is None) == (messages is None):
            raise InvalidInputError("give exactly one of 'prompt' and 'messages'")
        if self.prompter is not None and (messages is not None or isinstance(prompt, str)):
            return self._prepare_vision(prompt, messages, images, tools, chat)
        if images:
            raise InvalidInputError(f"{self.name} is not a multimodal model" if self.prompter is None
                                    else "a token-id prompt cannot take images: give the prompt as text")
        if messages is not None:
            text = self.tokenizer.render(messages, options=chat, tools=list(tools) if tools else None)
            return PreparedPrompt(self.tokenizer.tokenizer.encode(text, add_special_tokens=False).ids, text)
        if isinstance(prompt, str):
            return PreparedPrompt(self.tokenizer.encode_prompt(prompt), prompt)
        ids = list(prompt)  # type: ignore[arg-type]
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.folder.vocab_size for t in ids):
            raise InvalidInputError(f"a token-id prompt must hold integers in [0, {self.folder.vocab_size})")
        return PreparedPrompt(ids, self.tokenizer.decode(ids))

    def truncated(self, prepared: PreparedPrompt, keep: int) -> PreparedPrompt:
        """``prepared`` with only its last ``keep`` tokens (-1: the context length), vLLM's
        ``truncate_prompt_tokens``. InvalidInputError for more than the context, or a prompt with images
        (cutting one would leave its features without their tokens)."""
        limit = self.context_length
        keep = limit if keep == -1 else keep
        if keep > limit:
            raise InvalidInputError(f"'truncate_prompt_tokens' ({keep}) is more than {self.name}'s context of "
                                    f"{limit} tokens")
        if prepared.inputs is not None:
            raise InvalidInputError("'truncate_prompt_tokens' cannot cut a prompt with images")
        if len(prepared.ids) <= keep:
            return prepared
        ids = prepared.ids[-keep:]
        return PreparedPrompt(ids, self.tokenizer.decode(ids))

    def tokenize(self, prompt: str | None = None, messages: Sequence[Mapping[str, Any]] | None = None,
                 tools: Sequence[Any] | None = None, chat: ChatOptions = DEFAULT_CHAT,
                 add_special_tokens: bool | None = None) -> list[int]:
        """The prompt's token ids as ``prepare`` makes them, without running the vision encoder (a VLM
        decodes each image for its size only). ``add_special_tokens``: whether the tokenizer adds its
        own (default: for a plain prompt yes, for rendered messages no, as ``prepare``)."""
        if (prompt is None) == (messages is None):
            raise InvalidInputError("give exactly one of 'prompt' and 'messages'")
        if prompt is not None and not isinstance(prompt, str):
            raise InvalidInputError(f"the prompt must be a string, got {type(prompt).__name__}")
        if self.prompter is not None:
            text, inputs, plain = self._vision_text(prompt, messages, None, tools, chat)
            if inputs and hasattr(self.prompter, "token_ids"):
                return self.prompter.token_ids(text, inputs, add_special_tokens=plain, encode_special=add_special_tokens)
            if inputs:  # onnxruntime-genai's processor expands the images: no cheaper way to the ids
                return self.prepare(prompt, messages, None, tools, chat).ids
        else:
            text = prompt if messages is None else self.tokenizer.render(messages, options=chat,
                                                                        tools=list(tools) if tools else None)
            plain = messages is None
        special = plain if add_special_tokens is None else add_special_tokens
        return self.tokenizer.tokenizer.encode(text, add_special_tokens=special).ids

    def estimate(self, prompt: str | Sequence[int] | None = None,
                 messages: Sequence[Mapping[str, Any]] | None = None, images: Sequence[Any] | None = None,
                 tools: Sequence[Any] | None = None, chat: ChatOptions = DEFAULT_CHAT) -> PromptEstimate | None:
        """What ``prepare`` and the prefill of a VLM request with images will cost, before any image
        is decoded (``VisionPrompter.estimate``): how a router decides where it runs without paying
        its image work first. None for a model or request without images, or one not estimable
        cheaply (``prepare`` then reports what is wrong with it)."""
        estimator = getattr(self.prompter, "estimate", None)  # onnxruntime-genai's processor gives none
        if estimator is None or (prompt is None) == (messages is None):
            return None
        if messages is None and not isinstance(prompt, str):  # token ids take no images
            return None
        try:
            text, inputs, plain = self._vision_text(prompt, messages, images, tools, chat)
        except InvalidInputError:
            return None
        if not inputs:
            return None
        try:
            return estimator(text, inputs, add_special_tokens=plain, cached=self.prefix_cache.peek)
        except Exception as exc:  # NOTE: an estimate only advises the router: prepare reports the input's fault
            log.warning("model %s: no cost estimate for a request (%s: %s); routing it after its image work",
                        self.name, type(exc).__name__, exc)
            return None

    def cached_tokens(self, prepared: PreparedPrompt) -> int:
        """How many of ``prepared``'s tokens the prefix cache holds now (not counted as a lookup)."""
        return self.prefix_cache.peek(prepared.cache_key if prepared.cache_key is not None else prepared.ids)

    def _prepare_vision(self, prompt: str | Sequence[int] | None, messages: Sequence[Mapping[str, Any]] | None,
                        images: Sequence[Any] | None, tools: Sequence[Any] | None = None,
                        chat: ChatOptions = DEFAULT_CHAT) -> PreparedPrompt:
        assert self.prompter is not None
        text, inputs, plain = self._vision_text(prompt, messages, images, tools, chat)
        if not inputs:
            ids = (self.tokenizer.encode_prompt(text) if plain
                   else self.tokenizer.tokenizer.encode(text, add_special_tokens=False).ids)
            return PreparedPrompt(ids, text)
        built = self.prompter.build(text, inputs, add_special_tokens=plain)
        if built.timings is not None:
            t = built.timings
            self.vision_stats.record(t.images, t.image_tokens, (t.decode_ms + t.preprocess_ms) / 1e3, t.encode_ms / 1e3)
        return PreparedPrompt(built.ids, built.text, built.inputs, built.cache_key, built.timings)

    def _vision_text(self, prompt: str | Sequence[int] | None, messages: Sequence[Mapping[str, Any]] | None,
                     images: Sequence[Any] | None, tools: Sequence[Any] | None,
                     chat: ChatOptions = DEFAULT_CHAT) -> tuple[str, list[Any], bool]:
        """(prompt text with image placeholders, the image inputs, whether it is a plain prompt) of a
        VLM request: chat messages rendered by the template, or a text prompt with ``images``."""
        from edge_runtime.generation.vision.messages import image_inputs, split_images

        inputs = image_inputs(images, chat.processor_kwargs)
        if messages is None:
            assert isinstance(prompt, str)
            return prompt, inputs, True
        if inputs:
            raise InvalidInputError("give images as image parts of 'messages', not as 'images'")
        shaped, inputs = split_images(messages, chat.processor_kwargs)
        return (self.tokenizer.render(shaped, options=chat, multimodal=True, tools=list(tools) if tools else None),
                inputs, False)

    def submit(self, prepared: PreparedPrompt, params: SamplingParams, sink: Any) -> Any:
        """Queue one request; ``sink(chunk)`` is called on the batcher thread. Returns a handle for ``cancel``."""
        for name, ids in (("logit_bias", [token for token, _ in params.logit_bias]),
                          ("stop_token_ids", params.stop_token_ids)):
            outside = [token for token in ids if token >= self.folder.vocab_size]
            if outside:
                raise InvalidInputError(f"'{name}' token id {outside[0]} is outside the vocabulary "
                                        f"(ids 0 to {self.folder.vocab_size - 1})")
        if prepared.inputs is not None or prepared.cache_key is not None:
            return self.batcher.submit(prepared.ids, params, sink, inputs=prepared.inputs,
                                       cache_key=prepared.cache_key)
        return self.batcher.submit(prepared.ids, params, sink)

    def cancel(self, handle: Any) -> None:
        self.batcher.cancel(handle)

    def generate(self, prompt: str | Sequence[int] | None = None, *,
                 messages: Sequence[Mapping[str, Any]] | None = None, images: Sequence[Any] | None = None,
                 timeout_s: float | None = None, **params: Any) -> GenerationResult:
        """Generate to the end; blocks. ``params``: SamplingParams fields (default greedy), the structured
        output and tool fields, and for ``messages`` the ``ChatOptions`` fields (``chat_template_kwargs``,
        ``add_generation_prompt``, ``continue_final_message``)."""
        params.setdefault("temperature", 0.0)
        fields = {k: params.pop(k) for k in list(params) if k in STRUCTURED_FIELDS}
        chat = _chat_options(params)
        started = time.perf_counter()
        structured, sampling = self.structure(fields, sampling_params(**params), chat=messages is not None,
                                              options=chat)
        prepared = self.prepare(prompt, messages, images, tools=_offered(structured), chat=chat)
        submitted = time.perf_counter()
        gathered = _Gathered()
        handle = self.submit(prepared, sampling, gathered)
        if not gathered.done.wait(timeout_s):
            self.cancel(handle)
            raise TimeoutError(f"generation took longer than {timeout_s} s")
        assert gathered.last is not None
        first = gathered.first_at - started if gathered.first_at is not None else None
        # a chat answer's reasoning starts in the prompt when its template opened the block (None: not read)
        opened = None
        if messages is not None and self.reasoning_parser:
            from edge_runtime.generation.reasoning import opens_in_prompt

            opened = opens_in_prompt(prepared.text)
        return self._result(gathered.collected, gathered.last, first, time.perf_counter() - started,
                            request_timings(prepared, handle, started, submitted),
                            self.tool_parser if structured.parses_tools else None, opened)

    async def stream(self, prompt: str | Sequence[int] | None = None, *,
                     messages: Sequence[Mapping[str, Any]] | None = None, images: Sequence[Any] | None = None,
                     **params: Any) -> AsyncIterator[Chunk]:
        """Chunks as they are produced; leaving the loop early cancels the sequence. A VLM's image work
        runs in a worker thread, off the event loop."""
        params.setdefault("temperature", 0.0)
        fields = {k: params.pop(k) for k in list(params) if k in STRUCTURED_FIELDS}
        chat = _chat_options(params)
        structured, sampling = self.structure(fields, sampling_params(**params), chat=messages is not None,
                                              options=chat)
        if self.prompter is not None:
            prepared = await asyncio.to_thread(self.prepare, prompt, messages, images, _offered(structured), chat)
        else:
            prepared = self.prepare(prompt, messages, images, tools=_offered(structured), chat=chat)
        async for chunk in self.stream_prepared(prepared, sampling):
            yield chunk

    async def stream_prepared(self, prepared: PreparedPrompt, params: SamplingParams) -> AsyncIterator[Chunk]:
        """The async form for adapters (HTTP): cancels the sequence when the consumer stops early."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[Chunk] = asyncio.Queue()
        handle = self.submit(prepared, params, lambda c: loop.call_soon_threadsafe(chunks.put_nowait, c))
        try:
            while True:
                chunk = await chunks.get()
                if chunk.error is not None:
                    raise chunk.error
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            if handle.finish_reason is None:
                self.cancel(handle)

    def iter_chunks(self, prompt: str | Sequence[int] | None = None, *,
                    messages: Sequence[Mapping[str, Any]] | None = None, images: Sequence[Any] | None = None,
                    **params: Any) -> Iterator[Chunk]:
        """Synchronous chunk iterator (the CLI's streaming)."""
        params.setdefault("temperature", 0.0)
        fields = {k: params.pop(k) for k in list(params) if k in STRUCTURED_FIELDS}
        chat = _chat_options(params)
        structured, sampling = self.structure(fields, sampling_params(**params), chat=messages is not None,
                                              options=chat)
        chunks: "queue.Queue[Chunk]" = queue.Queue()
        handle = self.submit(self.prepare(prompt, messages, images, tools=_offered(structured), chat=chat), sampling,
                             chunks.put)
        try:
            while True:
                chunk = chunks.get()
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            if handle.finish_reason is None:
                self.cancel(handle)

    @staticmethod
    def _result(collected: _Collected, last: Chunk, first: float | None, elapsed: float,
                timings: RequestTimings | None = None, tool_parser: str | None = None,
                reasoning_opened: bool | None = None) -> GenerationResult:
        """``reasoning_opened``: None leaves the text whole; else the reasoning is split off first (True: the
        prompt opened it) and tool calls are read from the rest."""
        if last.error is not None:
            raise last.error
        assert last.usage is not None and last.finish_reason is not None
        from edge_runtime.generation.reasoning import read_answer

        text, reason = "".join(collected.texts), last.finish_reason
        reasoning, content = read_answer(text, "", reasoning_opened)
        calls: list[Any] = []
        if tool_parser is not None and content is not None:
            from edge_runtime.generation.tool_parsers import parse

            content, calls = parse(tool_parser, content)
            reason = "tool_calls" if calls and reason == "stop" else reason
        return GenerationResult(text, reason, last.usage, tuple(collected.ids), tuple(collected.logprobs), first,
                                elapsed, timings, tuple(calls), content, reasoning, collected.prompt_logprobs)

    def close(self) -> None:
        self.batcher.close(10.0)
        if self.prompter is not None:
            self.prompter.encoder.close()
        if self.prefix_cache.store is not None:
            self.prefix_cache.store.close()


def _prefix_store(folder: Any, settings: GenerationSettings, threads: int, cache_dir: Path | None) -> Any:
    """The prefix cache's blocks on disk (``[generation] prefix_cache_disk_bytes`` > 0), under a key of the graph
    that computes them (for a VLM: all three parts) and of what changes its arithmetic (threads, flushing)."""
    if settings.prefix_cache_disk_bytes <= 0 or settings.prefix_cache_bytes <= 0:
        return None
    from edge_runtime.config import default_cache_dir
    from edge_runtime.generation.prefix_store import SUBDIR, PrefixStore, store_key

    files = tuple(dict.fromkeys((folder.model_path, *folder.weight_files)))
    key = store_key(files, f"{folder.kv}|threads={threads}|flush={settings.flush_denormals}",
                    settings.prefix_block_tokens)
    return PrefixStore((cache_dir or default_cache_dir()) / SUBDIR / key, settings.prefix_cache_disk_bytes)


def _log_quantization(name: str, path: Path) -> None:
    """Say how a folder written by ``edge-runtime quantize`` was quantized (its ``quantization.json``):
    a kernel chosen by measurement was chosen on the machine that quantized it."""
    from edge_runtime.errors import ModelLoadError
    from edge_runtime.generation.folder import read_json

    try:
        record = read_json(path / "quantization.json")
    except ModelLoadError as exc:  # informational only: a damaged record must not stop the load
        log.warning("generative model %s: %s", name, exc)
        return
    if record:
        kernel = record.get("kernel", "MatMulNBits")  # folders quantized before the kernel choice: MatMulNBits
        how = "activations per token" if kernel == "MatMulInteger" else f"accuracy level {record.get('accuracy_level')}"
        log.info("generative model %s: %s weights, %s %s (%s; median step ms per kernel and rows where "
                 "quantized: %s)", name, record.get("mode"), kernel, how,
                 record.get("kernel_choice", record.get("accuracy_level_choice")),
                 record.get("step_ms", record.get("level_step_ms")))


def _chat_options(params: dict[str, Any]) -> ChatOptions:
    """The ``ChatOptions`` fields taken out of ``params`` (those left are sampling parameters)."""
    fields = {k: params.pop(k) for k in ("chat_template_kwargs", "add_generation_prompt", "continue_final_message",
                                         "mm_processor_kwargs") if k in params}
    return ChatOptions.from_body(fields) if fields else DEFAULT_CHAT


def _offered(structured: Any) -> list[Any] | None:
    """The tools the chat template renders (OpenAI's tool definitions, as transformers passes them)."""
    return list(structured.tools.tools) if structured.tools is not None else None


def load_generative(path: Path, name: str | None = None, settings: GenerationSettings | None = None,
                    threads: int = 1, *, vision: "VisionSettings | None" = None,
                    vision_loader: "VisionLoader | None" = None, cache_dir: Path | None = None) -> GenerativeModel:
    """Load a generative folder (``optimum`` layout, a vision-language model in the transformers.js
    layout, or onnxruntime-genai's with the ``genai`` extra); raises ModelLoadError saying what is wrong."""
    path = Path(path)
    return GenerativeModel(name or path.name, path, settings, threads=threads, vision=vision,
                           vision_loader=vision_loader, cache_dir=cache_dir)
