"""``Model``: one compiled model behind a small sync/async API with input validation."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from backends.base import CompileOptions, Executable, TensorSpec, describe_of
from edge_runtime.validation import validate_feeds

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadReport:
    """How a model was placed: the backend, why, and what was tried first."""

    backend: str
    reason: str
    node_count: int
    backend_nodes: dict[str, int]
    tried: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    decision: Any = None  # plan_race.PlanDecision: auto's measured race, when auto chose

    def to_dict(self) -> dict[str, Any]:
        described = {"backend": self.backend, "reason": self.reason, "node_count": self.node_count,
                     "backend_nodes": dict(self.backend_nodes),
                     "tried": [{"backend": b, "why_not": why} for b, why in self.tried]}
        if self.decision is not None:  # estimate and measurement of every candidate
            described["auto_decision"] = self.decision.to_dict()
        return described


class Model:
    """A loaded model. ``run`` is synchronous; ``run_async`` runs it in a worker thread.

    Calls are serialised by a lock unless the executable says it is thread-safe
    (``thread_safe = True``, as ONNX Runtime sessions are).
    """

    def __init__(self, name: str, path: Path, executable: Executable, report: LoadReport,
                 executor: Executor, options: CompileOptions | None = None) -> None:
        self.name = name
        self.path = path
        self.report = report
        self.options = options  # what it was compiled with (threads, spinning), when known
        self._executable = executable
        self._executor = executor
        self._lock = None if getattr(executable, "thread_safe", False) else threading.Lock()

    @property
    def backend(self) -> str:
        return self.report.backend

    @property
    def inputs(self) -> list[TensorSpec]:
        return list(self._executable.inputs)

    @property
    def outputs(self) -> list[TensorSpec]:
        return list(self._executable.outputs)

    @property
    def backend_nodes(self) -> dict[str, int]:
        return dict(self.report.backend_nodes)

    @property
    def executable(self) -> Executable:
        return self._executable

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), **self.report.to_dict(),
                "inputs": [s.to_dict() for s in self.inputs],
                "outputs": [s.to_dict() for s in self.outputs],
                "executable": describe_of(self._executable, self.backend)}

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Validate ``feeds`` (InvalidInputError names the tensor) and run once."""
        return self._run_validated(validate_feeds(self.inputs, feeds))

    async def run_async(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """As ``run``, in a worker thread; never blocks the event loop."""
        arrays = validate_feeds(self.inputs, feeds)  # cheap: fail fast on the loop
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run_validated, arrays)

    def _run_validated(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._lock is None:
            return self._executable.run(arrays)
        with self._lock:
            return self._executable.run(arrays)

    def close(self) -> None:
        self._executable.close()

    def __repr__(self) -> str:
        return f"Model({self.name!r}, backend={self.backend!r}, inputs={[s.name for s in self.inputs]})"
