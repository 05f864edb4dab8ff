"""Generative model versions in the repository: a folder recognised by its contents.

A version folder that ``is_generative_folder`` (an ``optimum`` decoder with its
tokenizer) loads as a ``GenerativeModel`` instead of a tensor model. Its
``GenerationDispatcher`` fits the repository's version lifecycle (start,
drain on close, pending count) and answers the generation routes
(``openai_routes``, ``generate_routes``) — locally, or through the model's
``[cloud]`` peer (an OpenAI-compatible server) when ``GenerationRouter`` says so.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator

from edge_runtime.cloud.config import CloudModelConfig, model_cloud_config
from edge_runtime.errors import InvalidInputError
from edge_runtime.generation.settings import generation_settings

if TYPE_CHECKING:
    from edge_runtime.generation.cloud_router import GenerationRouter
    from edge_runtime.generation.model import GenerativeModel, PreparedPrompt
    from edge_runtime.generation.sampling import SamplingParams
    from edge_runtime.generation.sequence import Chunk
    from edge_runtime.scheduler import ModelConfig
    from edge_runtime.serving.layout import ServingConfig
    from edge_runtime.serving.repository import LoadedVersion
    from edge_runtime.serving.services import SharedServices

log = logging.getLogger(__name__)


class GenerationDispatcher:
    """Answers one generative version; ``stream`` yields ``Chunk``s from wherever it ran."""

    scheduler = None  # no tensor scheduler: /infer is not how a decoder is called

    def __init__(self, name: str, model: "GenerativeModel", cloud: CloudModelConfig,
                 router: "GenerationRouter | None" = None) -> None:
        self.name = name
        self.model = model
        self.cloud = cloud
        self.router = router

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
                                f"/v1/completions or /v2/models/{self.name}/generate")

    async def stream(self, prepared: "PreparedPrompt", params: "SamplingParams",
                     request: Any = None) -> AsyncIterator["Chunk"]:
        """Chunks of one request; ``request`` (the parsed OpenAI request) lets the router forward it."""
        if self.router is not None:
            async for chunk in self.router.stream(prepared, params, request):
                yield chunk
            return
        async for chunk in self.model.stream_prepared(prepared, params):
            yield chunk


def generative_version(name: str, version: int, folder: Path, config: "ModelConfig", serving: "ServingConfig",
                       runtime: Any, services: "SharedServices") -> "LoadedVersion":
    """Load ``folder`` as a generative version (blocking: call it in a worker thread)."""
    from edge_runtime.generation.model import load_generative
    from edge_runtime.serving.repository import LoadedVersion

    where = f"model {name!r} config"
    settings = generation_settings(config.extra, where)
    cloud = model_cloud_config(config.extra, where)
    model = load_generative(folder, name, settings, threads=runtime.threads)
    router = None
    try:
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
    return LoadedVersion(name, version, model, GenerationDispatcher(name, model, cloud, router), config, serving)
