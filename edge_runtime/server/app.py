"""``create_app``: the aiohttp application factory of the inference server."""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

from aiohttp import web

from edge_runtime.server.config import ServerConfig
from edge_runtime.server.generation_metrics import GenerationCollector
from edge_runtime.server.metrics import ServerCollector, make_registry
from edge_runtime.server.middleware import auth_middleware, error_middleware
from edge_runtime.serving.dataplane import DataPlane
from edge_runtime.serving.repository import ModelRepository
from edge_runtime.server.routes import add_routes
from edge_runtime.server.responses_store import ResponseStore
from edge_runtime.server.state import STATE, ServerState
from edge_runtime.serving.stats import InferenceStats
from edge_runtime.server.tasks import TaskStore

log = logging.getLogger(__name__)


def create_app(config: ServerConfig, repository: ModelRepository) -> web.Application:
    """The app serving ``repository``; models load on startup and drain on cleanup.

    Startup opens the repository's shared LoadMonitor and CloudClient; cleanup
    closes them after the models drained. The caller owns the repository's
    ``Runtime`` and closes it after the app.
    """
    stats = InferenceStats()
    tasks = TaskStore(config.task_ttl_s, config.max_tasks, config.max_task_bytes, config.overload_status)
    registry = make_registry(ServerCollector(stats, repository, tasks.counts))
    registry.register(GenerationCollector(repository))  # prefix cache and batch figures of generative models
    app = web.Application(client_max_size=config.max_body_bytes,
                          middlewares=[error_middleware(config.overload_status, config.retry_after_s),
                                       auth_middleware(config.token)])
    plane = DataPlane(repository, stats, default_priority_level=config.default_priority_level)
    app[STATE] = ServerState(config, plane, tasks, registry, responses=ResponseStore(config.responses_store_bytes))
    add_routes(app)
    app.cleanup_ctx.append(_serve_models)
    if config.grpc_port is not None:
        app.cleanup_ctx.append(_serve_grpc)  # after the models load; stopped before they drain
    app.on_shutdown.append(_stop_ready)
    return app


async def _serve_models(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    state.repository.start()
    await state.repository.load_all()
    state.ready = True
    log.info("ready: %d model version(s) served", len(state.repository.served()))
    yield
    # Runs after aiohttp finished (or timed out) the in-flight handlers.
    state.ready = False
    await state.tasks.drain(state.config.drain_timeout_s)
    await state.repository.close()
    state.regions.close()


async def _serve_grpc(app: web.Application) -> AsyncIterator[None]:
    """The KServe v2 gRPC service (``grpc_service``) for the app's lifetime; in-flight calls get the drain
    timeout when it stops."""
    from edge_runtime.server.grpc_service import start_grpc

    state = app[STATE]
    server, state.grpc_port = await start_grpc(state)
    log.info("gRPC (KServe v2) on %s:%d", state.config.host, state.grpc_port)
    state.grpc_stop = lambda: server.stop(state.config.drain_timeout_s)
    yield
    await state.grpc_stopping if state.grpc_stopping is not None else server.stop(state.config.drain_timeout_s)


async def _stop_ready(app: web.Application) -> None:
    # on_shutdown runs before in-flight requests are awaited: readiness goes false at once, and the
    # gRPC service takes no new calls from now on (its in-flight ones get the drain timeout), as the
    # HTTP socket closes.
    state = app[STATE]
    state.ready = False
    if state.grpc_stop is not None and state.grpc_stopping is None:
        state.grpc_stopping = asyncio.ensure_future(state.grpc_stop())
