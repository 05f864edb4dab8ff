"""``GenerativeModel``: the embedded API of a decoder LLM folder (``Runtime.load(folder)``).

    model = Runtime().load("qwen2-0.5b-onnx/")
    result = model.generate(messages=[{"role": "user", "content": "hi"}], max_tokens=32)
    result.text, result.usage.completion_tokens
    async for chunk in model.stream(prompt="Once", max_tokens=16):
        print(chunk.text, end="")

Every request goes through the model's ``ContinuousBatcher`` (its own thread),
so concurrent callers share decode steps. ``generate`` defaults to greedy
decoding (``temperature=0``); the OpenAI routes default to OpenAI's 1.0.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, Mapping, Sequence

from edge_runtime.errors import InvalidInputError
from edge_runtime.generation.sampling import SamplingParams, TokenChoice
from edge_runtime.generation.sequence import Chunk, Usage
from edge_runtime.generation.settings import GenerationSettings

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


@dataclass(frozen=True)
class PreparedPrompt:
    """A request's prompt as token ids (and the text they came from)."""

    ids: list[int]
    text: str


@dataclass
class _Collected:
    texts: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    logprobs: list[TokenChoice] = field(default_factory=list)

    def add(self, chunk: Chunk) -> None:
        self.texts.append(chunk.text)
        self.ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs)


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
    return SamplingParams(**kwargs)


class GenerativeModel:
    """A loaded decoder: tokenizer, engine, prefix cache, batcher. ``close`` stops it."""

    backend = "cpu"
    inputs: list[Any] = []
    outputs: list[Any] = []

    def __init__(self, name: str, path: Path, settings: GenerationSettings | None = None, *,
                 threads: int = 1) -> None:
        from edge_runtime.generation.batcher import ContinuousBatcher
        from edge_runtime.generation.chat import ChatTokenizer
        from edge_runtime.generation.engine import DecoderEngine
        from edge_runtime.generation.folder import read_folder
        from edge_runtime.generation.prefix_cache import PrefixCache

        from edge_runtime.generation.folder import is_genai_folder

        self.name = name
        self.path = Path(path)
        self.settings = settings or GenerationSettings()
        self.tokenizer = ChatTokenizer(self.path)
        self.engine = None
        if is_genai_folder(self.path):  # onnxruntime-genai owns model and KV: no prefix cache of ours
            from edge_runtime.generation.genai_engine import GenaiBatcher, read_genai_folder

            self.backend = "onnxruntime-genai"
            self.folder = read_genai_folder(self.path)
            self.prefix_cache = PrefixCache(self.settings.prefix_block_tokens, 0)
            self.batcher = GenaiBatcher(self.folder, self.settings, self.tokenizer.decode)
        else:
            from edge_runtime.generation.footprint import kv_positions

            self.folder = read_folder(self.path)
            max_len = kv_positions(self.folder, self.settings)
            self.engine = DecoderEngine(self.folder, threads=self.settings.threads or threads,
                                        max_batch=self.settings.max_batch_size, max_len=max_len)
            self.prefix_cache = PrefixCache(self.settings.prefix_block_tokens, self.settings.prefix_cache_bytes)
            self.batcher = ContinuousBatcher(self.engine, self.settings, self.prefix_cache,
                                             frozenset(self.folder.eos_token_ids), self.tokenizer.decode)
        self.batcher.start()
        log.info("generative model %s on %s: %s, %d layers, context %d, KV %d B/token", name, self.backend,
                 self.folder.model_type or "decoder", self.folder.kv.layers, self.batcher.max_len,
                 self.folder.kv.bytes_per_token)

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

    # -- requests ---------------------------------------------------------------------
    def prepare(self, prompt: str | Sequence[int] | None = None,
                messages: Sequence[Mapping[str, Any]] | None = None) -> PreparedPrompt:
        """Token ids of a plain prompt (text or ids) or of chat messages rendered by the template."""
        if (prompt is None) == (messages is None):
            raise InvalidInputError("give exactly one of 'prompt' and 'messages'")
        if messages is not None:
            text = self.tokenizer.render(messages)
            return PreparedPrompt(self.tokenizer.tokenizer.encode(text, add_special_tokens=False).ids, text)
        if isinstance(prompt, str):
            return PreparedPrompt(self.tokenizer.encode_prompt(prompt), prompt)
        ids = list(prompt)  # type: ignore[arg-type]
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.folder.vocab_size for t in ids):
            raise InvalidInputError(f"a token-id prompt must hold integers in [0, {self.folder.vocab_size})")
        return PreparedPrompt(ids, self.tokenizer.decode(ids))

    def submit(self, prepared: PreparedPrompt, params: SamplingParams, sink: Any) -> Any:
        """Queue one request; ``sink(chunk)`` is called on the batcher thread. Returns a handle for ``cancel``."""
        return self.batcher.submit(prepared.ids, params, sink)

    def cancel(self, handle: Any) -> None:
        self.batcher.cancel(handle)

    def generate(self, prompt: str | Sequence[int] | None = None, *,
                 messages: Sequence[Mapping[str, Any]] | None = None, timeout_s: float | None = None,
                 **params: Any) -> GenerationResult:
        """Generate to the end; blocks. ``params``: SamplingParams fields (default greedy)."""
        params.setdefault("temperature", 0.0)
        chunks: "queue.Queue[Chunk]" = queue.Queue()
        started = time.perf_counter()
        handle = self.submit(self.prepare(prompt, messages), sampling_params(**params), chunks.put)
        collected = _Collected()
        first: float | None = None
        while True:
            try:
                chunk = chunks.get(timeout=timeout_s)
            except queue.Empty:
                self.cancel(handle)
                raise TimeoutError(f"generation took longer than {timeout_s} s") from None
            if first is None and chunk.token_ids:
                first = time.perf_counter() - started
            collected.add(chunk)
            if chunk.finish_reason is not None:
                return self._result(collected, chunk, first, time.perf_counter() - started)

    async def stream(self, prompt: str | Sequence[int] | None = None, *,
                     messages: Sequence[Mapping[str, Any]] | None = None, **params: Any) -> AsyncIterator[Chunk]:
        """Chunks as they are produced; leaving the loop early cancels the sequence."""
        params.setdefault("temperature", 0.0)
        async for chunk in self.stream_prepared(self.prepare(prompt, messages), sampling_params(**params)):
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
                    messages: Sequence[Mapping[str, Any]] | None = None, **params: Any) -> Iterator[Chunk]:
        """Synchronous chunk iterator (the CLI's streaming)."""
        params.setdefault("temperature", 0.0)
        chunks: "queue.Queue[Chunk]" = queue.Queue()
        handle = self.submit(self.prepare(prompt, messages), sampling_params(**params), chunks.put)
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
    def _result(collected: _Collected, last: Chunk, first: float | None, elapsed: float) -> GenerationResult:
        if last.error is not None:
            raise last.error
        assert last.usage is not None and last.finish_reason is not None
        return GenerationResult("".join(collected.texts), last.finish_reason, last.usage, tuple(collected.ids),
                                tuple(collected.logprobs), first, elapsed)

    def close(self) -> None:
        self.batcher.close(10.0)


def load_generative(path: Path, name: str | None = None, settings: GenerationSettings | None = None,
                    threads: int = 1) -> GenerativeModel:
    """Load a generative folder (``optimum`` layout, or onnxruntime-genai's with the ``genai`` extra);
    raises ModelLoadError saying what is wrong."""
    path = Path(path)
    return GenerativeModel(name or path.name, path, settings, threads=threads)
