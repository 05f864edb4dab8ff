"""Load work that waits for the first request's shapes: warm-up and the batching experiment.

A model declared ``[-1, 3, ?, ?]`` cannot be warmed up or probed at load without
making up a size it may reject (see ``edge_runtime.served_shapes``). ``ShapeJobs``
holds such work and starts it, once, as background tasks on the event loop when the
first request shows the shapes the model is served at (rows bound to 1 where dim 0 is
dynamic). The jobs send their own requests at ``DEFERRED_PRIORITY``, behind every real
one, so the request that told the shapes never waits for them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Mapping, Sequence

from backends.base import TensorSpec
from edge_runtime.served_shapes import request_shapes

log = logging.getLogger(__name__)

ShapeJob = Callable[[Mapping[str, tuple[int, ...]]], Awaitable[None]]
DEFERRED_PRIORITY = -(2 ** 31)  # below any priority a client sends: behind every real request


class ShapeJobs:
    """Jobs of one model waiting for its first request's shapes. Used on the event loop only."""

    def __init__(self, model: str, inputs: Sequence[TensorSpec]) -> None:
        self.model = model
        self.inputs = list(inputs)
        self._waiting: list[ShapeJob] = []
        self._running: set[asyncio.Task] = set()

    def add(self, job: ShapeJob) -> None:
        self._waiting.append(job)

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    def start(self, feeds: Mapping[str, Any]) -> None:
        """Start every waiting job at ``feeds``' shapes (nothing when an input is missing)."""
        shapes = request_shapes(self.inputs, feeds)
        if shapes is None or not self._waiting:
            return
        jobs, self._waiting = self._waiting, []
        log.info("model %s: first request's shapes %s: deferred warm-up and probes start", self.model,
                 {name: list(dims) for name, dims in shapes.items()})
        for job in jobs:
            task = asyncio.ensure_future(self._run(job, shapes))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    def cancel(self) -> None:
        for task in list(self._running):
            task.cancel()

    async def _run(self, job: ShapeJob, shapes: Mapping[str, tuple[int, ...]]) -> None:
        try:
            await job(shapes)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - deferred load work never fails a request
            log.info("model %s: deferred work at %s failed (%s: %s)", self.model, dict(shapes),
                     type(exc).__name__, exc)
