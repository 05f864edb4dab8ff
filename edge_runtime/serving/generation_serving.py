"""Generative model versions in the repository: a folder recognised by its contents.

A version folder that ``is_generative_folder`` (an ``optimum`` decoder with its
tokenizer) loads as a ``GenerativeModel`` instead of a tensor model, and is
warmed up (``edge_runtime.generation.warmup``) before the repository serves it.
Its ``GenerationDispatcher`` fits the repository's version lifecycle (start,
drain on close, pending count) and answers the generation routes
(``openai_routes``, ``generate_routes``) — locally, or through the model's
``[cloud]`` peer (an OpenAI-compatible server) when ``GenerationRouter`` says so.
Each stream it hands out holds the model busy for the memory budget until the
stream ends or is closed, so the budget never unloads a model mid-stream.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

from edge_runtime.cloud.config import CloudModelConfig, model_cloud_config
from edge_runtime.errors import InvalidInputError
from edge_runtime.generation.settings import generation_settings

if TYPE_CHECKING:
    from edge_runtime.generation.cloud_router import GenerationRouter
    from edge_runtime.generation.model import GenerativeModel, PreparedPrompt
    from edge_runtime.generation.prepared import PromptEstimate
    from edge_runtime.generation.sampling import SamplingParams
    from edge_runtime.generation.sequence import Chunk
    from edge_runtime.memory_budget import MemoryBudget
    from edge_runtime.scheduler import ModelConfig
    from edge_runtime.serving.layout import ServingConfig
    from edge_runtime.serving.repository import LoadedVersion
    from edge_runtime.serving.services import SharedServices

log = logging.getLogger(__name__)


class BusyStream:
    """The chunks of one request, holding its model busy (``release`` not yet called) from creation
    until the chunks end, fail, or ``aclose`` is called.

    Busy from creation, not from the first chunk: a request handed to an async task may wait
    before its first ``anext``, and the model must stay loaded meanwhile.
    """

    def __init__(self, chunks: AsyncIterator["Chunk"], release: Callable[[], None]) -> None:
        self._chunks = chunks
        self._release = release  # idempotent (MemoryBudget.hold)

    def __aiter__(self) -> "BusyStream":
        return self

    async def __anext__(self) -> "Chunk":
        try:
            return await anext(self._chunks)
        except BaseException:  # StopAsyncIteration included: the stream is over either way
            self._release()
            raise

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()  # type: ignore[attr-defined]
        finally:
            self._release()

    def __del__(self) -> None:
        # NOTE: a backstop for a stream dropped unstarted (an async task cancelled before it ran):
        # nothing else would release the hold, and the model could never be unloaded again.
        self._release()


class GenerationDispatcher:
    """Answers one generative version; ``stream`` yields ``Chunk``s from wherever it ran."""

    scheduler = None  # no tensor scheduler: /infer is not how a decoder is called

    def __init__(self, name: str, model: "GenerativeModel", cloud: CloudModelConfig,
                 router: "GenerationRouter | None" = None, budget: "MemoryBudget | None" = None) -> None:
        self.name = name
        self.model = model
        self.cloud = cloud
        self.router = router
        self.budget = budget

    @property
    def plans(self) -> list[str]:
        return ["generate"] + (["cloud"] if self.router is not None else [])

    @property
    def pending(self) -> int:
        return self.model.batcher.pending

    async def start(self) -> None:
        return None

    async def close(self, drain_timeout_s: float) -> None:
        await asyncio.to_thread(self.model.batcher.close, drain_timeout_s)
        self.discard()

    def discard(self) -> None:
        if self.router is not None:
            self.router.close()
            self.router = None

    async def infer(self, *args: Any, **kwargs: Any) -> Any:
        raise InvalidInputError(f"model {self.name!r} generates text: call POST /v1/chat/completions, "
                                f"/v1/completions or /v2/models/{self.name}/generate, or infer with its "
                                "'text_input' tensor")

    @property
    def forwards(self) -> bool:
        """True when a request this model cannot read (images for a text-only model) can go to its
        ``[cloud]`` peer instead."""
        return self.router is not None

    def stream_remote(self, params: "SamplingParams", request: Any) -> BusyStream:
        """Chunks of ``request`` from the cloud peer, unconditionally (the model cannot read it);
        the model is held busy as by ``stream`` (its router and breaker belong to it)."""
        if self.router is None:
            raise InvalidInputError(f"model {self.name!r} has no [cloud] peer to forward this request to")
        release = self.budget.hold(self.name) if self.budget is not None else _nothing
        return BusyStream(self.router.stream_remote(params, request), release)

    def stream(self, prepared: "PreparedPrompt", params: "SamplingParams", request: Any = None,
               release: Callable[[], None] | None = None) -> BusyStream:
        """Chunks of one request; ``request`` (the parsed OpenAI request) lets the router forward it.

        The model is busy for the memory budget from this call until the stream ends or is
        closed: close it (``aclose``) when not reading it to the end.
        """
        return BusyStream(self._chunks(prepared, params, request), self.hold() if release is None else release)

    async def stream_completion(self, parsed: Any) -> BusyStream:
        """A plain completion (a parsed ``/v1/completions`` body: Triton's generate extension, the text
        tensors of ``text_tensors``) prepared and streamed as ``stream`` does, its constraint
        (``structured_outputs``, ``response_format``) compiled first — off the event loop when the
        grammar is new, the model held busy meanwhile — so it is honoured, never silently dropped."""
        # what a completion can ask for but one text answer cannot carry: a 400, never dropped silently
        unsupported = [name for name, asked in (("n", parsed.n != 1), ("echo", parsed.echo),
                                                 ("logprobs", parsed.params.logprobs),
                                                 ("prompt_logprobs", parsed.params.prompt_logprobs is not None))
                       if asked]
        if unsupported:
            raise InvalidInputError(f"{unsupported} cannot be answered as one text output: call POST /v1/completions")
        params, release = parsed.params, None
        if parsed.structured.guide is not None:
            params, release = await self.constrained(parsed.structured, params)
        try:
            prepared = self.model.prepare(prompt=parsed.prompt)
            if parsed.truncate is not None:
                prepared = self.model.truncated(prepared, parsed.truncate)
            return self.stream(prepared, params, replace(parsed, params=params), release=release)
        except BaseException:
            if release is not None:
                release()
            raise

    async def constrained(self, structured: Any, params: "SamplingParams",
                          after_reasoning: str = "") -> tuple["SamplingParams", Callable[[], None] | None]:
        """(``params`` with the request's constraint and tool grammars compiled, the model's busy-hold release
        or None). A new grammar (and, the first time, llguidance's tokenizer) takes milliseconds to seconds
        for a large schema: it compiles on a thread, so other requests' tokens keep flowing, with the model
        held busy meanwhile (hand the release to ``stream``); a cached one costs nothing. InvalidInputError
        when a grammar does not compile or the model cannot constrain."""
        from edge_runtime.generation.structured import compiles_anew, resolve

        grammars = getattr(self.model, "grammars", None)
        parser = getattr(self.model, "tool_parser", "json")
        if not compiles_anew(structured, grammars, parser, after_reasoning):
            return resolve(structured, params, grammars, parser, after_reasoning), None
        release = self.hold()
        try:
            return await asyncio.to_thread(resolve, structured, params, grammars, parser, after_reasoning), release
        except BaseException:
            release()
            raise

    def stream_deferred(self, prepare: Callable[[], Awaitable["PreparedPrompt"]], estimate: "PromptEstimate",
                        params: "SamplingParams", request: Any, release: Callable[[], None]) -> BusyStream:
        """As ``stream`` for a request whose ``prepare`` is expensive (a VLM's images): the router
        decides from ``estimate`` before it runs (``GenerationRouter.stream_deferred``)."""
        if self.router is None:
            raise InvalidInputError(f"model {self.name!r} has no [cloud] peer to route this request by")
        return BusyStream(self.router.stream_deferred(prepare, estimate, params, request), release)

    def hold(self) -> Callable[[], None]:
        """Mark the model busy for the memory budget now; returns the (idempotent) release. For work
        that must keep the model loaded before its stream exists (a VLM prepares images first)."""
        return self.budget.hold(self.name) if self.budget is not None else _nothing

    async def _chunks(self, prepared: "PreparedPrompt", params: "SamplingParams",
                      request: Any) -> AsyncIterator["Chunk"]:
        if self.router is not None:
            async for chunk in self.router.stream(prepared, params, request):
                yield chunk
            return
        async for chunk in self.model.stream_prepared(prepared, params):
            yield chunk


def _nothing() -> None:
    return None


def planned_charge(name: str, folder: Path, config: "ModelConfig", footprint_factor: float,
                   cache_dir: Path | None = None) -> dict[str, int]:
    """The budget parts (``weights``, ``kv_cache``, ``prefix_cache``) loading ``folder`` will take
    (``cache_dir``: the runtime's, where an optimum export's fused rebuild is kept)."""
    from edge_runtime.generation.footprint import planned_footprint

    from edge_runtime.generation.vision.settings import vision_settings

    where = f"model {name!r} config"
    settings = generation_settings(config.extra, where)
    return planned_footprint(folder, settings, footprint_factor, vision_settings(config.extra, where),
                             cache_dir).parts()


def generative_version(name: str, version: int, folder: Path, config: "ModelConfig", serving: "ServingConfig",
                       runtime: Any, services: "SharedServices", budget: "MemoryBudget | None" = None,
                       footprint_factor: float = 1.0) -> "LoadedVersion":
    """Load ``folder`` as a generative version and warm it up (blocking: call it in a worker thread).

    The version's ``charge`` holds its budget parts as allocated (``loaded_footprint``).
    Raises ConfigError for a bad table, ModelLoadError when it does not load or warm up.
    """
    from edge_runtime.generation.footprint import loaded_footprint
    from edge_runtime.generation.model import load_generative
    from edge_runtime.generation.warmup import generation_warmup_config, warm_up_generative
    from edge_runtime.load_extras import VersionExtras
    from edge_runtime.serving.repository import LoadedVersion

    where = f"model {name!r} config"
    settings = generation_settings(config.extra, where)
    cloud = model_cloud_config(config.extra, where)
    warmup = generation_warmup_config(config.extra.get("warmup"), where)
    from edge_runtime.generation.vision.settings import vision_settings

    vision = vision_settings(config.extra, where)
    model = load_generative(folder, name, settings, threads=runtime.threads, vision=vision,
                            vision_loader=runtime.load_vision_encoder, cache_dir=runtime.config.cache_dir)
    router = None
    try:
        extras = VersionExtras(warm_up_generative(model, warmup), None)  # before it serves: ready means warm
        if cloud.mode != "never" and services.cloud is not None:
            from edge_runtime.generation.cloud_router import GenerationRouter

            router = GenerationRouter(model, cloud, services.cloud.config, services.cloud.breaker,
                                      on_call=services.cloud_calls.hook(name))
        elif cloud.mode != "never":
            log.warning("model %s: [cloud] mode %r, but the server has no [cloud] url: serving it locally only",
                        name, cloud.mode)
    except BaseException:
        model.close()
        raise
    return LoadedVersion(name, version, model, GenerationDispatcher(name, model, cloud, router, budget), config,
                         serving, extras=extras, charge=loaded_footprint(model, footprint_factor).parts())
