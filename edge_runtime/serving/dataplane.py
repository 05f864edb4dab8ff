"""The data plane: one inference call for every transport, knowing models and requests but no HTTP.

::

    plane = DataPlane(repository, stats, default_priority_level=1)
    outcome = await plane.infer("cls", None, {"x": array}, {"priority": 1, "timeout": 5000})
    outcome.outputs            # name -> np.ndarray, every output of the model
    outcome.parameters         # where and how it ran (below), ready for a response

In two steps, for a transport that must answer client mistakes before it
commits to anything (the HTTP route's async tasks, shared-memory regions to pin)::

    target = plane.resolve(name, version)        # ModelNotFoundError
    prepared = plane.prepare(target, feeds, parameters, request_id=...)   # InvalidInputError
    outcome = await plane.run(prepared)          # QueueFullError, DeadlineExceededError, BackendError, ...

``prepare`` validates the feeds once (names, dtypes, shapes; the scheduler
trusts them) and reads the scheduling parameters (Triton's ``priority`` level
and ``timeout`` in microseconds). ``run`` queues on the version's dispatcher
(scheduler or cloud router), waits, and records the outcome in the
statistics; a transport that fails later (encoding) reports it with
``record_failure``. Nothing here imports aiohttp; errors are the family's.

Outcome ``parameters`` (strings, integers, booleans): ``plan``, ``backends``
(comma separated), ``ran_on`` (``local``, ``cloud``, ``split``), ``queue_us``,
``compute_us``, ``batch_size``, ``retried``, ``ran_twice``, and when they apply
``fallback`` (why the first plan, stage or route did not answer) and ``route``
(the cloud router's reason).

Hooks for later features (a result cache, warm-up, memory budgets) wrap
``run`` or read ``resolve``; the call's arguments and the outcome stay as above.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from edge_runtime.errors import (
    BackendError,
    BackendUnavailableError,
    CloudError,
    ConfigError,
    DeadlineExceededError,
    InvalidInputError,
    ModelLoadError,
    QueueFullError,
    UnsupportedNodesError,
)
from edge_runtime.protocol.codec import schedule_parameters
from edge_runtime.scheduler import InferenceResult
from edge_runtime.serving.dispatch import Answer
from edge_runtime.serving.layout import check_model_name, parse_version
from edge_runtime.serving.repository import LoadedVersion, ModelRepository
from edge_runtime.serving.stats import InferenceStats
from edge_runtime.validation import validate_feeds

# Triton's failure reasons (nv_inference_request_failure{reason}), most specific class first.
FAILURE_REASONS: tuple[tuple[type[BaseException], str], ...] = (
    (QueueFullError, "REJECTED"),
    (DeadlineExceededError, "TIMEOUT"),
    (UnsupportedNodesError, "OTHER"),
    (InvalidInputError, "INVALID"),
    (ConfigError, "INVALID"),
    (ModelLoadError, "OTHER"),
    (CloudError, "BACKEND"),
    (BackendError, "BACKEND"),
    (BackendUnavailableError, "BACKEND"),
    (asyncio.CancelledError, "CANCELED"),
)


def failure_reason(exc: BaseException) -> str:
    """The statistics' reason for ``exc``: the first row of ``FAILURE_REASONS`` it is an instance of."""
    return next((reason for cls, reason in FAILURE_REASONS if isinstance(exc, cls)), "OTHER")


@dataclass(frozen=True)
class PreparedInference:
    """A request checked against its target version: validated feeds and scheduling options."""

    target: LoadedVersion
    feeds: dict[str, np.ndarray]
    rows: int  # inferences this request holds (rows of a dynamic batch dimension, else 1)
    priority: int
    timeout_ms: float | None
    request_id: str | None = None
    started_ns: int = field(default_factory=time.perf_counter_ns)


@dataclass(frozen=True)
class InferenceOutcome:
    """What ran: the model version, its outputs, and where and how (``parameters``)."""

    model: str
    version: int
    result: InferenceResult
    ran_on: str
    route: str | None = None

    @property
    def outputs(self) -> dict[str, np.ndarray]:
        return self.result.outputs

    @property
    def parameters(self) -> dict[str, str | int | bool]:
        result = self.result
        parameters: dict[str, str | int | bool] = {
            "plan": result.plan, "backends": ",".join(result.backends), "ran_on": self.ran_on,
            "queue_us": round(result.queue_ms * 1e3), "compute_us": round(result.compute_ms * 1e3),
            "batch_size": result.batch_size, "retried": result.retried, "ran_twice": result.ran_twice}
        if result.fallback:
            parameters["fallback"] = result.fallback
        if self.route:
            parameters["route"] = self.route
        return parameters


class DataPlane:
    """Inference over a ``ModelRepository`` (see the module docstring); event-loop side."""

    def __init__(self, repository: ModelRepository, stats: InferenceStats | None = None, *,
                 default_priority_level: int = 0) -> None:
        self.repository = repository
        self.stats = stats or InferenceStats()
        self.default_priority_level = default_priority_level

    def resolve(self, model: str, version: str | int | None = None) -> LoadedVersion:
        """The served version (highest when None); InvalidInputError for a bad name, ModelNotFoundError."""
        check_model_name(model)
        if isinstance(version, str):
            version = parse_version(version)
        return self.repository.get(model, version)

    def prepare(self, target: LoadedVersion, feeds: Mapping[str, Any], parameters: Mapping[str, Any] | None = None,
                *, request_id: str | None = None, started_ns: int | None = None) -> PreparedInference:
        """Validate ``feeds`` and ``parameters`` for ``target``; a mistake raises and is counted INVALID."""
        started_ns = started_ns or time.perf_counter_ns()
        try:
            arrays = validate_feeds(target.model.inputs, feeds)
            priority, timeout_ms = schedule_parameters(parameters or {}, self.default_priority_level)
        except Exception as exc:
            self.record_failure(target, exc, started_ns)
            raise
        return PreparedInference(target, arrays, _rows(target, arrays), priority, timeout_ms, request_id, started_ns)

    async def run(self, prepared: PreparedInference) -> InferenceOutcome:
        """Queue, wait, count; raises what the dispatcher raises (QueueFullError, DeadlineExceededError, ...)."""
        target = prepared.target
        try:
            answer = await target.dispatcher.infer(prepared.feeds, priority=prepared.priority,
                                                   timeout_ms=prepared.timeout_ms, request_id=prepared.request_id,
                                                   validated=True)
        except BaseException as exc:
            self.record_failure(target, exc, prepared.started_ns)
            raise
        self.stats.record_success(target.name, str(target.version), answer.result, prepared.rows,
                                  time.perf_counter_ns() - prepared.started_ns, answer.fallback_labels)
        return _outcome(target, answer)

    async def infer(self, model: str, version: str | int | None, feeds: Mapping[str, Any],
                    parameters: Mapping[str, Any] | None = None, *, request_id: str | None = None) -> InferenceOutcome:
        """``resolve`` + ``prepare`` + ``run``: the whole call for an in-process caller."""
        # NOTE: no await between resolve and run's dispatch: a reload cannot swap the version in between.
        return await self.run(self.prepare(self.resolve(model, version), feeds, parameters, request_id=request_id))

    def record_failure(self, target: LoadedVersion, exc: BaseException, started_ns: int) -> None:
        """Count a failed request of ``target`` (the transport's own failures too: decoding, encoding)."""
        self.stats.record_failure(target.name, str(target.version), failure_reason(exc),
                                  time.perf_counter_ns() - started_ns)


def _outcome(target: LoadedVersion, answer: Answer) -> InferenceOutcome:
    return InferenceOutcome(target.name, target.version, answer.result, answer.ran_on, answer.route)


def _rows(target: LoadedVersion, feeds: dict[str, np.ndarray]) -> int:
    first = target.model.inputs[0] if target.model.inputs else None
    if first is None or not first.shape or isinstance(first.shape[0], int):
        return 1
    array = feeds.get(first.name)
    return int(array.shape[0]) if array is not None and array.ndim else 1
