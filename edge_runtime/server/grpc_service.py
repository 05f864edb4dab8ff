"""KServe v2 / Open Inference Protocol over gRPC (``inference.GRPCInferenceService``), beside HTTP.

Off unless ``[server] grpc_port`` (``edge-runtime serve --grpc-port``) is set: the service then
listens on the HTTP server's host, in the same event loop, over the same data plane, repository,
statistics and shared-memory regions — a second adapter of the data plane, as the HTTP routes are
one. Messages and stubs are those ``tritonclient[grpc]`` generates (the protocol's reference
client ships them; we generate nothing), so Triton's and KServe's gRPC clients work unchanged:

* health, server and model metadata, model configuration (Triton's ``ModelConfig``), statistics;
* ``ModelInfer`` (typed contents or ``raw_input_contents``, system shared memory, Triton's
  ``priority`` and ``timeout`` parameters) and ``ModelStreamInfer`` (each request of a stream
  answered as it completes, errors as ``error_message`` without ending the stream);
* text generators through Triton's LLM interface (``serving.text_tensors``: ``text_input`` in,
  ``text_output`` out, streamed chunk by chunk over ``ModelStreamInfer`` with ``stream`` true);
* the repository extension (index, load, unload) and system shared memory (status, register,
  unregister). CUDA shared memory, trace and log settings answer ``UNIMPLEMENTED``.

Errors keep the HTTP route's message and map its status to a gRPC code (400 ->
``INVALID_ARGUMENT``, 404 -> ``NOT_FOUND``, overload -> ``UNAVAILABLE``, 504 ->
``DEADLINE_EXCEEDED`` ...). With a token, every call but ``ServerLive`` / ``ServerReady`` needs
``authorization: Bearer <token>`` metadata, as HTTP needs the header.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from edge_runtime.errors import EdgeRuntimeError, InvalidInputError, ModelNotFoundError
from edge_runtime.protocol.codec import check_outputs
from edge_runtime.protocol.grpc_codec import decode_infer_request, encode_infer_response
from edge_runtime.server import documents, inference
from edge_runtime.server.errors import INTERNAL, UnauthorizedError, mapping_of, public_message
from edge_runtime.server.state import ServerState
from edge_runtime.serving.layout import check_model_name, parse_version
from edge_runtime.serving.text_tensors import is_text_generator, open_stream, text_output, text_request, whole_answer

log = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
PUBLIC_METHODS = (f"/{SERVICE}/ServerLive", f"/{SERVICE}/ServerReady")  # health answers without a token
# HTTP status of the error table -> gRPC code (Triton's choices: a full queue is UNAVAILABLE)
CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED, 404: grpc.StatusCode.NOT_FOUND,
         409: grpc.StatusCode.FAILED_PRECONDITION, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
         429: grpc.StatusCode.UNAVAILABLE, 502: grpc.StatusCode.UNAVAILABLE, 503: grpc.StatusCode.UNAVAILABLE,
         504: grpc.StatusCode.DEADLINE_EXCEEDED}
STREAM_IN_FLIGHT = 256  # requests of one ModelStreamInfer stream answered at once; more wait to be read
# Triton's TYPE_* names of the wire datatypes (BYTES is TYPE_STRING)
_CONFIG_TYPES = {"BYTES": "TYPE_STRING"}


def _rpc(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A unary method whose errors end the call with the error table's code and the public message."""

    @functools.wraps(method)
    async def call(self: "InferenceService", request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            code, message = self.status_of(exc, method.__name__)
            await context.abort(code, message)

    return call


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The servicer over one server's state (see the module docstring)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def status_of(self, exc: BaseException, method: str) -> tuple[grpc.StatusCode, str]:
        mapping = mapping_of(exc, self.state.config.overload_status)
        if mapping.status >= 500:
            log.log(logging.ERROR if mapping is INTERNAL else logging.WARNING, "gRPC %s -> %d: %s", method,
                    mapping.status, exc, exc_info=mapping is INTERNAL)
        return CODES.get(mapping.status, grpc.StatusCode.INTERNAL), public_message(exc)

    def _target(self, name: str, version: str) -> Any:
        return self.state.repository.get(check_model_name(name), parse_version(version) if version else None)

    # -- health and metadata ------------------------------------------------------------------
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.state.ready)

    @_rpc
    async def ModelReady(self, request: Any, context: Any) -> Any:
        try:
            self._target(request.name, request.version)
        except ModelNotFoundError:
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=True)

    @_rpc
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return json_format.ParseDict(documents.server_metadata(), service_pb2.ServerMetadataResponse())

    @_rpc
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        document = documents.model_metadata(self.state, self._target(request.name, request.version))
        return json_format.ParseDict(document, service_pb2.ModelMetadataResponse(), ignore_unknown_fields=True)

    @_rpc
    async def ModelConfig(self, request: Any, context: Any) -> Any:
        return service_pb2.ModelConfigResponse(config=triton_config(self._target(request.name, request.version)))

    @_rpc
    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        versions = documents.versions_of(self.state, request.name, request.version)
        return json_format.ParseDict(documents.model_stats(self.state, versions),
                                     service_pb2.ModelStatisticsResponse(), ignore_unknown_fields=True)

    # -- inference ----------------------------------------------------------------------------
    @_rpc
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        return await self._infer(request)

    async def _infer(self, request: Any) -> Any:
        responses = self._responses(request, streaming=False)
        try:
            return await anext(responses)  # unstreamed: exactly one
        finally:
            await responses.aclose()

    async def _responses(self, request: Any, streaming: bool) -> AsyncIterator[Any]:
        """The response(s) of one request: one for a tensor model; for a text generator one, or with its
        ``stream`` input (``streaming`` calls only) one per chunk of text."""
        state, name, version = self.state, request.model_name, request.model_version or None
        await state.repository.ensure_loaded(check_model_name(name))  # [memory] lazy_load, or unloaded
        target = state.plane.resolve(name, version)
        if is_text_generator(target):
            async for response in self._text_responses(target, request, streaming):
                yield response
            return
        yield await self._tensor_response(request, name, version)

    async def _tensor_response(self, request: Any, name: str, version: str | None) -> Any:
        state = self.state
        started_ns = inference.now_ns()
        lease = state.regions.lease()
        try:
            try:
                decoded = decode_infer_request(request, lease)
            except EdgeRuntimeError as exc:
                inference.decode_failed(state.plane, name, version, exc, started_ns)
                raise
            # NOTE: no await between prepare and execute: a reload cannot swap the version in between.
            call = inference.prepare(state.plane, name, version, decoded, started_ns, lease)
            if call.wants_async:
                raise InvalidInputError("parameters.async is an HTTP extension (/v2/tasks); a gRPC client "
                                        "awaits the call, or streams with ModelStreamInfer")
        except BaseException:
            lease.release()
            raise
        return await inference.execute(state.plane, call, _encode)

    async def _text_responses(self, target: Any, request: Any, streaming: bool) -> AsyncIterator[Any]:
        """Triton's LLM interface (``serving.text_tensors``): ``text_output`` whole, or streamed chunk by
        chunk, each response flagged ``triton_final_response`` (an empty final one when the client asks
        with ``triton_enable_empty_final_response``, as Triton's decoupled models answer)."""
        decoded = decode_infer_request(request)
        text = text_request(target.name, decoded.inputs, decoded.parameters)
        check_outputs(decoded, ["text_output"])
        if not text.stream:
            answer, reason = await whole_answer(target, text)
            yield self._text_response(target, decoded, answer, reason, final=True)
            return
        if not streaming:
            raise InvalidInputError("input 'stream' is true: stream with ModelStreamInfer, or send stream false")
        empty_final = decoded.parameters.get("triton_enable_empty_final_response") is True
        chunks = await open_stream(target, text)
        try:
            async for chunk in chunks:
                last = chunk.finish_reason is not None
                if chunk.text or last:
                    yield self._text_response(target, decoded, chunk.text, chunk.finish_reason,
                                              final=last and not empty_final)
            if empty_final:
                response = service_pb2.ModelInferResponse(model_name=target.name, model_version=str(target.version),
                                                          id=decoded.id or "")
                response.parameters["triton_final_response"].bool_param = True
                yield response
        finally:
            await chunks.aclose()

    @staticmethod
    def _text_response(target: Any, decoded: Any, text: str, reason: str | None, final: bool) -> Any:
        parameters: dict[str, Any] = {"triton_final_response": final}
        if reason:
            parameters["finish_reason"] = reason
        return encode_infer_response(service_pb2.ModelInferResponse(), target.name, str(target.version), decoded,
                                     text_output(text), parameters)

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        """Each request answered as it completes (ids match them up); a failed one is an ``error_message``
        response and the stream goes on. The stream ends when the client's requests end and every answer
        was sent; a client gone cancels what it left running."""
        answers: asyncio.Queue[Any] = asyncio.Queue()
        slots = asyncio.Semaphore(STREAM_IN_FLIGHT)
        running: set[asyncio.Task[None]] = set()
        done = object()

        async def answer(message: Any) -> None:
            try:
                async for response in self._responses(message, streaming=True):
                    answers.put_nowait(service_pb2.ModelStreamInferResponse(infer_response=response))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _, text = self.status_of(exc, "ModelStreamInfer")
                failed = service_pb2.ModelStreamInferResponse(error_message=text)
                failed.infer_response.id, failed.infer_response.model_name = message.id, message.model_name
                answers.put_nowait(failed)
            finally:
                slots.release()

        async def read() -> None:
            try:
                async for message in request_iterator:
                    await slots.acquire()
                    task = asyncio.ensure_future(answer(message))
                    running.add(task)
                    task.add_done_callback(running.discard)
                if running:
                    await asyncio.gather(*running, return_exceptions=True)
            finally:
                answers.put_nowait(done)

        reader = asyncio.ensure_future(read())
        try:
            while (response := await answers.get()) is not done:
                yield response
        finally:
            for task in (reader, *running):
                task.cancel()
            await asyncio.gather(reader, *running, return_exceptions=True)

    # -- repository ---------------------------------------------------------------------------
    @_rpc
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        entries = self.state.repository.index(ready_only=request.ready)
        return json_format.ParseDict({"models": entries}, service_pb2.RepositoryIndexResponse())

    @_rpc
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        name = check_model_name(request.model_name)
        overrides = sorted(k for k in request.parameters if k == "config" or k.startswith("file:"))
        if overrides:
            raise InvalidInputError(f"load overrides {overrides} are not supported: edit {name}/config.toml "
                                    "and the version folders in the repository, then load again")
        await self.state.repository.load(name)
        return service_pb2.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        await self.state.repository.unload(check_model_name(request.model_name))
        return service_pb2.RepositoryModelUnloadResponse()

    # -- system shared memory -----------------------------------------------------------------
    @_rpc
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        regions = self.state.regions.status(request.name or None)
        return json_format.ParseDict({"regions": {r["name"]: r for r in regions}},
                                     service_pb2.SystemSharedMemoryStatusResponse())

    @_rpc
    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        self.state.regions.register(request.name, request.key, request.offset, request.byte_size)
        return service_pb2.SystemSharedMemoryRegisterResponse()

    @_rpc
    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        self.state.regions.unregister(request.name or None)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _NO_CUDA)

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _NO_CUDA)

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _NO_CUDA)


_NO_CUDA = "CUDA shared memory is not supported by this server; register system shared memory instead"


def _encode(outcome: Any, request: Any, lease: Any) -> Any:
    return encode_infer_response(service_pb2.ModelInferResponse(), outcome.model, str(outcome.version), request,
                                 outcome.outputs, outcome.parameters, lease)


def triton_config(target: Any) -> Any:
    """Triton's ``ModelConfig`` of a served version, from the same document as HTTP's ``/config``: inputs
    and outputs without the batch dimension when the model batches (Triton's convention)."""
    document = documents.model_config(target)
    batching = document["max_batch_size"] > 0
    config = model_config_pb2.ModelConfig(name=document["name"], platform=document["platform"],
                                          backend=document["backend"], max_batch_size=document["max_batch_size"])
    for key, field in (("input", config.input), ("output", config.output)):
        for tensor in document[key]:
            shape = tensor["shape"][1:] if batching and tensor["shape"] else tensor["shape"]
            field.add(name=tensor["name"], dims=shape,
                      data_type=model_config_pb2.DataType.Value(
                          _CONFIG_TYPES.get(tensor["datatype"], "TYPE_" + tensor["datatype"])))
    dynamic, queue = document["dynamic_batching"], document["queue_policy"]
    if batching:
        config.dynamic_batching.preferred_batch_size.extend(dynamic["preferred_batch_size"])
        config.dynamic_batching.max_queue_delay_microseconds = dynamic["max_queue_delay_microseconds"]
        config.dynamic_batching.default_queue_policy.max_queue_size = queue["max_queue_size"]
        config.dynamic_batching.default_queue_policy.default_timeout_microseconds = \
            queue["default_timeout_microseconds"]
    return config


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Every call but health needs ``authorization: Bearer <token>`` metadata (constant-time compare)."""

    def __init__(self, token: str) -> None:
        self.expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or details.method in PUBLIC_METHODS:
            return handler
        given = next((value for key, value in details.invocation_metadata or () if key == "authorization"), "")
        if hmac.compare_digest(str(given).encode(), self.expected):
            return handler
        message = public_message(UnauthorizedError("missing or wrong bearer token: send 'authorization: Bearer "
                                                   "<token>' metadata"))

        async def refuse(request: Any, context: Any) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        make = (grpc.stream_stream_rpc_method_handler if handler.request_streaming and handler.response_streaming
                else grpc.unary_unary_rpc_method_handler)
        return make(refuse, handler.request_deserializer, handler.response_serializer)


async def start_grpc(state: ServerState) -> tuple[grpc.aio.Server, int]:
    """Start the service on ``[server] host`` and ``grpc_port`` (0: any free port); returns it and its port."""
    config = state.config
    interceptors = [TokenInterceptor(config.token)] if config.token else []
    server = grpc.aio.server(interceptors=interceptors,
                             options=[("grpc.max_receive_message_length", config.max_body_bytes),
                                      ("grpc.max_send_message_length", -1)])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(state), server)
    host = f"[{config.host}]" if ":" in config.host else config.host
    port = server.add_insecure_port(f"{host}:{config.grpc_port}")
    if port == 0:
        raise OSError(f"cannot listen for gRPC on {config.host}:{config.grpc_port}")
    await server.start()
    return server, port

