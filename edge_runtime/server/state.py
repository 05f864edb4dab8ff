"""What every handler shares, stored on the app under one typed key."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from edge_runtime.server.config import ServerConfig
from edge_runtime.server.responses_store import ResponseStore
from edge_runtime.serving.dataplane import DataPlane
from edge_runtime.serving.repository import ModelRepository
from edge_runtime.serving.shared_memory import SharedMemoryRegions
from edge_runtime.serving.stats import InferenceStats
from edge_runtime.server.tasks import TaskStore


@dataclass
class ServerState:
    """Long-lived server objects; ``ready`` is False while models load and once draining starts."""

    config: ServerConfig
    plane: DataPlane
    tasks: TaskStore
    registry: CollectorRegistry
    regions: SharedMemoryRegions = field(default_factory=SharedMemoryRegions)
    ready: bool = False
    responses: ResponseStore = field(default_factory=lambda: ResponseStore(0))  # the Responses API's store
    grpc_port: int | None = None  # where the gRPC service listens, once started
    grpc_stop: Callable[[], Awaitable[None]] | None = None  # stops it (new calls refused, in-flight drained)
    grpc_stopping: "asyncio.Future[None] | None" = None  # that stop, once shutdown began

    @property
    def repository(self) -> ModelRepository:
        return self.plane.repository

    @property
    def stats(self) -> InferenceStats:
        return self.plane.stats


STATE = web.AppKey("edge_runtime_state", ServerState)
