"""One inference from request bytes to response bytes, through the model's scheduler.

``prepare`` does everything that can fail on the client's side at once
(model lookup, decoding, datatype and parameter checks) so a bad request is
answered before anything is queued, async or not. ``execute`` hands the
request to the version's ``Dispatcher`` (its scheduler, or its cloud router)
and encodes the result. Both record the outcome in the server's statistics.

Response ``parameters`` say where and how the request ran (values are strings,
integers and booleans, as the protocol allows): ``plan``, ``backends`` (comma
separated), ``ran_on`` (``local``, ``cloud`` or ``split``), ``queue_us``,
``compute_us``, ``batch_size``, ``retried`` and ``ran_twice`` (see
``InferenceResult``), and when they apply ``fallback`` (why the first plan or
route did not answer) and ``route`` (the cloud router's reason).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from edge_runtime.errors import InvalidInputError
from edge_runtime.protocol.codec import (
    EncodedResponse,
    InferRequest,
    check_outputs,
    decode_request,
    encode_response,
    feeds_for,
    schedule_parameters,
)
from edge_runtime.scheduler import InferenceResult
from edge_runtime.server.dispatch import Answer
from edge_runtime.server.errors import mapping_of
from edge_runtime.server.layout import check_model_name, parse_version
from edge_runtime.server.repository import LoadedVersion
from edge_runtime.server.state import ServerState


@dataclass(frozen=True)
class PreparedInference:
    target: LoadedVersion
    request: InferRequest
    feeds: dict[str, np.ndarray]
    rows: int  # inferences this request holds (rows of a dynamic batch dimension, else 1)
    priority: int
    timeout_ms: float | None
    started_ns: int

    @property
    def wants_async(self) -> bool:
        return self.request.parameters.get("async") is True


def prepare(state: ServerState, name: str, version: str | None, body: bytes,
            header_length: int | None) -> PreparedInference:
    """Resolve the model and decode the request; raises the family's client errors."""
    started_ns = time.perf_counter_ns()
    check_model_name(name)
    target = state.repository.get(name, parse_version(version) if version is not None else None)
    try:
        request = decode_request(body, header_length)
        feeds = feeds_for(request, target.model.inputs)
        check_outputs(request, [spec.name for spec in target.model.outputs])
        priority, timeout_ms = schedule_parameters(request.parameters, state.config.default_priority_level)
        if not isinstance(request.parameters.get("async", False), bool):
            raise InvalidInputError(f"parameters.async must be true or false, got {request.parameters['async']!r}")
    except Exception as exc:
        _record_failure(state, target, exc, started_ns)
        raise
    return PreparedInference(target, request, feeds, _rows(target, feeds), priority, timeout_ms, started_ns)


async def execute(state: ServerState, prepared: PreparedInference) -> EncodedResponse:
    """Queue on the scheduler, wait, encode; raises QueueFullError, DeadlineExceededError, ..."""
    target = prepared.target
    try:
        with state.repository.budget.using(target.name):  # never unloaded while this request is in flight
            answer = await _answer(target, prepared)
        result = answer.result
        response = encode_response(target.name, str(target.version), prepared.request, result.outputs,
                                   _parameters(answer))
    except asyncio.CancelledError:
        state.stats.record_failure(target.name, str(target.version), "CANCELED", _elapsed_ns(prepared.started_ns))
        raise
    except Exception as exc:
        _record_failure(state, target, exc, prepared.started_ns)
        raise
    state.stats.record_success(target.name, str(target.version), result, prepared.rows,
                               _elapsed_ns(prepared.started_ns), answer.fallback_labels)
    return response


async def _answer(target: LoadedVersion, prepared: PreparedInference) -> Answer:
    """The dispatcher's answer, or the version's result cache's (``edge_runtime.result_cache``), for the
    feeds padded to their shape buckets (``edge_runtime.shape_buckets``)."""
    extras = target.extras
    cache = extras.result_cache if extras is not None else None
    feeds = extras.buckets.apply(prepared.feeds) if extras is not None else prepared.feeds  # [shape_buckets]
    key = cache.key(target.name, target.version, feeds) if cache is not None else b""
    stored = cache.get(key) if cache is not None else None
    if stored is not None:
        return Answer(InferenceResult(stored, "result_cache", (), 0.0, 0.0, 1, prepared.request.id), "local",
                      "result_cache")
    answer = await target.dispatcher.infer(feeds, priority=prepared.priority,
                                           timeout_ms=prepared.timeout_ms, request_id=prepared.request.id)
    if cache is not None:
        cache.put(key, answer.result.outputs)  # successes only: a failure raised above
    return answer


def _parameters(answer: Answer) -> dict[str, str | int | bool]:
    result = answer.result
    parameters: dict[str, str | int | bool] = {
        "plan": result.plan, "backends": ",".join(result.backends), "ran_on": answer.ran_on,
        "queue_us": round(result.queue_ms * 1e3), "compute_us": round(result.compute_ms * 1e3),
        "batch_size": result.batch_size, "retried": result.retried, "ran_twice": result.ran_twice}
    if result.fallback:
        parameters["fallback"] = result.fallback
    if answer.route:
        parameters["route"] = answer.route
    return parameters


def _record_failure(state: ServerState, target: LoadedVersion, exc: BaseException, started_ns: int) -> None:
    reason = mapping_of(exc).reason
    state.stats.record_failure(target.name, str(target.version), reason, _elapsed_ns(started_ns))


def _elapsed_ns(started_ns: int) -> int:
    return time.perf_counter_ns() - started_ns


def _rows(target: LoadedVersion, feeds: dict[str, np.ndarray]) -> int:
    first = target.model.inputs[0] if target.model.inputs else None
    if first is None or not first.shape or isinstance(first.shape[0], int):
        return 1
    array = feeds.get(first.name)
    return int(array.shape[0]) if array is not None and array.ndim else 1
