"""The HTTP adapter of the data plane: v2 request bytes in, v2 response bytes out (the gRPC service
runs its decoded requests through the same ``prepare`` and ``execute``).

``decode`` parses a body (pure; large JSON bodies are parsed in a worker
thread so the event loop keeps serving). ``prepare`` resolves the model,
checks what the wire adds (datatypes, requested outputs, ``async``) and hands
the feeds to ``DataPlane.prepare``, so a bad request is answered before
anything is queued, async or not. ``execute`` runs it through the data plane
and encodes the outputs with the outcome's ``parameters`` (where and how it
ran: see ``edge_runtime.serving.dataplane``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from edge_runtime.protocol.codec import (
    EncodedResponse,
    InferRequest,
    check_outputs,
    decode_request,
    encode_response,
    feeds_for,
)
from edge_runtime.errors import EdgeRuntimeError, InvalidInputError
from edge_runtime.serving.dataplane import DataPlane, InferenceOutcome, PreparedInference
from edge_runtime.serving.shared_memory import RegionLease

T = TypeVar("T")

# JSON bodies (or output sets) above this are parsed / serialised off the event loop: below it, the
# thread hop costs more than the parse.
OFF_LOOP_BYTES = 8 * 1024


@dataclass(frozen=True)
class WireInference:
    """A prepared data-plane call plus the wire request it came from (for encoding its answer)."""

    prepared: PreparedInference
    request: InferRequest
    lease: RegionLease | None = None  # the shared-memory regions it reads and writes

    @property
    def wants_async(self) -> bool:
        return self.request.parameters.get("async") is True


async def decode(body: bytes, header_length: int | None, lease: RegionLease | None = None) -> InferRequest:
    """Parse a request body; JSON-only bodies above ``OFF_LOOP_BYTES`` in a worker thread."""
    if header_length is None and len(body) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(decode_request, body, header_length, lease)
    return decode_request(body, header_length, lease)


def prepare(plane: DataPlane, name: str, version: str | None, request: InferRequest,
            started_ns: int, lease: RegionLease | None = None) -> WireInference:
    """Resolve and check what the wire adds; a mistake raises and is counted on the model."""
    target = plane.resolve(name, version)
    try:
        feeds = feeds_for(request, target.model.inputs)
        check_outputs(request, [spec.name for spec in target.model.outputs])
        if not isinstance(request.parameters.get("async", False), bool):
            raise InvalidInputError(f"parameters.async must be true or false, got {request.parameters['async']!r}")
    except Exception as exc:
        plane.record_failure(target, exc, started_ns)
        raise
    prepared = plane.prepare(target, feeds, request.parameters, request_id=request.id, started_ns=started_ns)
    return WireInference(prepared, request, lease)


def decode_failed(plane: DataPlane, name: str, version: str | None, exc: EdgeRuntimeError, started_ns: int) -> None:
    """Count a body that did not decode on its model (an unknown model raises ModelNotFoundError instead)."""
    plane.record_failure(plane.resolve(name, version), exc, started_ns)


async def execute(plane: DataPlane, call: WireInference,
                  encoder: Callable[[InferenceOutcome, InferRequest, RegionLease | None], T] | None = None
                  ) -> EncodedResponse | T:
    """Run through the data plane and encode (v2 HTTP bytes, or what ``encoder`` makes of the outcome,
    the request and its lease: another transport's message); raises QueueFullError,
    DeadlineExceededError, ...

    The call's shared-memory lease ends here, whatever happens.
    """
    try:
        outcome = await plane.run(call.prepared)
        try:
            if encoder is not None:
                return encoder(outcome, call.request, call.lease)
            encode = (outcome.model, str(outcome.version), call.request, outcome.outputs, outcome.parameters,
                      call.lease)
            if _json_bytes(call.request, outcome.outputs) > OFF_LOOP_BYTES:
                return await asyncio.to_thread(encode_response, *encode)
            return encode_response(*encode)
        except Exception as exc:
            plane.record_failure(call.prepared.target, exc, call.prepared.started_ns)
            raise
    finally:
        if call.lease is not None:
            call.lease.release()


def _json_bytes(request: InferRequest, outputs: dict) -> int:
    """Roughly how many bytes of outputs go out as JSON text (binary ones cost no parse)."""
    if request.parameters.get("binary_data_output", False) is True and not request.outputs:
        return 0
    if request.outputs:
        return sum(getattr(outputs.get(o.name), "nbytes", 0) for o in request.outputs
                   if o.shared_memory is None and o.binary is not True)
    return sum(getattr(array, "nbytes", 0) for array in outputs.values())


def now_ns() -> int:
    return time.perf_counter_ns()


async def generate_text(target: Any, body: bytes, header_length: int | None) -> EncodedResponse:
    """A v2 request to a text generator (``serving.text_tensors``): the whole answer as ``text_output``.
    Streaming needs a streaming transport (gRPC ``ModelStreamInfer``, ``/generate_stream``)."""
    from edge_runtime.serving.text_tensors import text_output, text_request, whole_answer

    request = await decode(body, header_length)
    text = text_request(target.name, request.inputs, request.parameters)
    if text.stream:
        raise InvalidInputError(f"input 'stream' is true: stream over gRPC ModelStreamInfer or POST "
                                f"/v2/models/{target.name}/generate_stream")
    check_outputs(request, ["text_output"])
    answer, reason = await whole_answer(target, text)
    return encode_response(target.name, str(target.version), request, text_output(answer),
                           {"finish_reason": reason} if reason else None)
