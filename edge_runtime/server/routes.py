"""Every HTTP route in one table: KServe v2 / Open Inference Protocol plus our extensions.

Handlers parse, call the repository / inference service, serialise — nothing
else. Errors are raised as the error family and turned into responses by the
error middleware (``errors.py`` holds the one status table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from aiohttp import web

import edge_runtime
from edge_runtime.errors import EdgeRuntimeError, InvalidInputError
from edge_runtime.server import documents, inference
from edge_runtime.protocol import jsonio
from edge_runtime.protocol.codec import EncodedResponse, parse_json
from edge_runtime.server.errors import RequestTooLargeError, TaskStateError
from edge_runtime.server.generate_routes import GENERATE_ROUTES
from edge_runtime.server.generation_http import until_disconnect
from edge_runtime.server.openai_routes import OPENAI_ROUTES
from edge_runtime.server.responses_routes import RESPONSES_ROUTES
from edge_runtime.server.tokenize_routes import TOKENIZE_ROUTES
from edge_runtime.server.metrics import CONTENT_TYPE, scrape
from edge_runtime.serving.layout import check_model_name, is_decimal, parse_version
from edge_runtime.serving.repository import LoadedVersion
from edge_runtime.serving.text_tensors import is_text_generator
from edge_runtime.server.state import STATE, ServerState
from edge_runtime.server.tasks import CANCELLED, FAILED, PENDING, Task

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

HEADER_LENGTH = "Inference-Header-Content-Length"


def _state(request: web.Request) -> ServerState:
    return request.app[STATE]


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=jsonio.dumps(data), status=status, headers=headers, content_type="application/json")


def _inference_response(encoded: EncodedResponse) -> web.Response:
    headers = {} if encoded.header_length is None else {HEADER_LENGTH: str(encoded.header_length)}
    return web.Response(body=encoded.body, content_type=encoded.content_type, headers=headers)


async def _body(request: web.Request) -> bytes:
    limit = _state(request).config.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise RequestTooLargeError(f"request body is {request.content_length} bytes; the limit is {limit}")
    return await request.read()


async def _json_body(request: web.Request) -> dict[str, Any]:
    """An optional JSON object body (empty means ``{}``)."""
    body = await _body(request)
    if not body.strip():
        return {}
    document = parse_json(body)
    if not isinstance(document, dict):
        raise InvalidInputError("the request body must be a JSON object")
    return document


def _target(request: web.Request) -> LoadedVersion:
    name = check_model_name(request.match_info["model"])
    version = request.match_info.get("version")
    return _state(request).repository.get(name, parse_version(version) if version is not None else None)


# -- server ---------------------------------------------------------------------------------
async def server_metadata(request: web.Request) -> web.Response:
    return _json(documents.server_metadata())


async def health_live(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def health_ready(request: web.Request) -> web.Response:
    if not _state(request).ready:
        return _json({"error": "not ready: loading models or draining"}, status=503)
    return web.Response(status=200)


# -- models ---------------------------------------------------------------------------------
async def model_metadata(request: web.Request) -> web.Response:
    return _json(documents.model_metadata(_state(request), _target(request)))


async def model_ready(request: web.Request) -> web.Response:
    _target(request)  # raises 404 when not served
    return web.Response(status=200)


async def model_config(request: web.Request) -> web.Response:
    return _json(documents.model_config(_target(request)))


async def model_stats(request: web.Request) -> web.Response:
    info = request.match_info
    return _json(documents.model_stats(_state(request), documents.versions_of(_state(request), info.get("model"),
                                                                               info.get("version"))))


async def infer(request: web.Request) -> web.Response:
    state = _state(request)
    started_ns = inference.now_ns()
    name, version = request.match_info["model"], request.match_info.get("version")
    body = await _body(request)
    await state.repository.ensure_loaded(name)  # [memory] lazy_load, or unloaded by the budget
    target = state.plane.resolve(name, version)
    if is_text_generator(target):  # Triton's LLM interface: text_input in, text_output out
        answer = inference.generate_text(target, body, _header_length(request))
        return _inference_response(await until_disconnect(request, answer))  # a client gone stops it
    lease = state.regions.lease()
    try:
        try:
            decoded = await inference.decode(body, _header_length(request), lease)
        except EdgeRuntimeError as exc:
            inference.decode_failed(state.plane, name, version, exc, started_ns)
            raise
        # NOTE: no await between prepare and execute/submit: a reload cannot swap the version in between.
        call = inference.prepare(state.plane, name, version, decoded, started_ns, lease)
    except BaseException:
        lease.release()
        raise
    prefer_async = "respond-async" in request.headers.get("Prefer", "").lower()
    if not (prefer_async or call.wants_async):
        return _inference_response(await inference.execute(state.plane, call))
    target = call.prepared.target
    task = state.tasks.submit(target.name, str(target.version), lambda: inference.execute(state.plane, call))
    headers = {"Location": f"/v2/tasks/{task.id}"}
    if prefer_async:
        headers["Preference-Applied"] = "respond-async"
    return _json(task.to_dict(), status=202, headers=headers)


# -- system shared memory (Triton's extension) -------------------------------------------------
async def shm_register(request: web.Request) -> web.Response:
    document = await _json_body(request)
    name = request.match_info["region"]
    _state(request).regions.register(name, document.get("key"), document.get("offset", 0),
                                     document.get("byte_size"))
    return web.Response(status=200)


async def shm_unregister(request: web.Request) -> web.Response:
    await _json_body(request)
    _state(request).regions.unregister(request.match_info.get("region"))
    return web.Response(status=200)


async def shm_status(request: web.Request) -> web.Response:
    return _json(_state(request).regions.status(request.match_info.get("region")))


def _header_length(request: web.Request) -> int | None:
    text = request.headers.get(HEADER_LENGTH)
    if text is None:
        return None
    if not is_decimal(text.strip()):
        raise InvalidInputError(f"{HEADER_LENGTH} must be a non-negative integer, got {text[:40]!r}")
    return int(text)


# -- repository -----------------------------------------------------------------------------
async def repository_index(request: web.Request) -> web.Response:
    document = await _json_body(request)
    ready = document.get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidInputError(f"'ready' must be true or false, got {ready!r}")
    return _json(_state(request).repository.index(ready_only=ready))


async def repository_load(request: web.Request) -> web.Response:
    name = check_model_name(request.match_info["model"])
    parameters = (await _json_body(request)).get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInputError(f"'parameters' must be an object, got {type(parameters).__name__}")
    overrides = sorted(k for k in parameters if k == "config" or str(k).startswith("file:"))
    if overrides:
        raise InvalidInputError(f"load overrides {overrides} are not supported: edit {name}/config.toml "
                                "and the version folders in the repository, then load again")
    versions = await _state(request).repository.load(name)
    return _json({"name": name, "versions": [str(v) for v in versions]})


async def repository_unload(request: web.Request) -> web.Response:
    name = check_model_name(request.match_info["model"])
    await _json_body(request)  # Triton clients send {"parameters": {"unload_dependents": ...}}: no dependents here
    await _state(request).repository.unload(name)
    return _json({"name": name})


# -- async tasks ----------------------------------------------------------------------------
def _task_document(task: Task) -> dict[str, Any]:
    document = task.to_dict()
    if task.response is not None and task.response.header_length is None:
        document["response"] = jsonio.loads(task.response.body)
    return document


async def task_status(request: web.Request) -> web.Response:
    return _json(_task_document(_state(request).tasks.get(request.match_info["task_id"])))


async def task_result(request: web.Request) -> web.Response:
    task = _state(request).tasks.get(request.match_info["task_id"])
    if task.status in (PENDING, CANCELLED):
        raise TaskStateError(f"task {task.id} is {task.status}; it has no result")
    if task.status == FAILED:
        return _json({"error": task.error}, status=task.error_status or 500)
    assert task.response is not None  # succeeded tasks always hold their response
    return _inference_response(task.response)


async def task_cancel(request: web.Request) -> web.Response:
    return _json(_task_document(await _state(request).tasks.cancel(request.match_info["task_id"])))


# -- operations -----------------------------------------------------------------------------
async def metrics(request: web.Request) -> web.Response:
    body = scrape(_state(request).registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def openapi(request: web.Request) -> web.Response:
    from edge_runtime.server.openapi import openapi_document

    return _json(openapi_document(ROUTES, edge_runtime.__version__))


@dataclass(frozen=True)
class Route:
    """One route; ``ok`` and ``body`` name OpenAPI schemas (see ``openapi.py``)."""

    method: str
    path: str
    handler: Handler
    summary: str
    ok: str | None = None  # response schema of the success status; None = empty body
    body: str | None = None  # request body schema; None = no body
    tag: str = "server"


_M = "/v2/models/{model}"
_V = "/v2/models/{model}/versions/{version}"

ROUTES: tuple[Route, ...] = (
    Route("GET", "/v2", server_metadata, "Server metadata and supported extensions", "ServerMetadata"),
    Route("GET", "/v2/health/live", health_live, "Liveness: 200 while the process serves HTTP"),
    Route("GET", "/v2/health/ready", health_ready, "Readiness: 200 once models are loaded, 503 while draining"),
    Route("GET", "/v2/models/stats", model_stats, "Statistics of every served model version", "ModelStats",
          tag="models"),
    *(route for base in (_M, _V) for route in (
        Route("GET", base, model_metadata, "Model metadata: inputs, outputs, versions", "ModelMetadata",
              tag="models"),
        Route("GET", f"{base}/ready", model_ready, "Model readiness: 200 when served, 404 otherwise",
              tag="models"),
        Route("GET", f"{base}/config", model_config, "Serving configuration of the model", "ModelConfig",
              tag="models"),
        Route("GET", f"{base}/stats", model_stats, "Statistics (Triton statistics extension)", "ModelStats",
              tag="models"),
        Route("POST", f"{base}/infer", infer, "Run an inference (JSON or binary tensors; async on request)",
              "InferenceResponse", "InferenceRequest", tag="inference"),
    )),
    Route("POST", "/v2/repository/index", repository_index, "Models and versions in the repository",
          "RepositoryIndex", "RepositoryIndexRequest", tag="repository"),
    Route("POST", "/v2/repository/models/{model}/load", repository_load,
          "Load or reload a model; on failure the old versions keep serving", "LoadResponse", "LoadRequest",
          tag="repository"),
    Route("POST", "/v2/repository/models/{model}/unload", repository_unload,
          "Unload a model; queued requests finish first", "LoadResponse", "LoadRequest", tag="repository"),
    Route("GET", "/v2/tasks/{task_id}", task_status, "Status of an async task (JSON results inline)", "Task",
          tag="tasks"),
    Route("GET", "/v2/tasks/{task_id}/result", task_result, "The async task's inference response, as /infer "
          "would have returned it", "InferenceResponse", tag="tasks"),
    Route("DELETE", "/v2/tasks/{task_id}", task_cancel, "Cancel a pending task or forget a finished one", "Task",
          tag="tasks"),
    Route("GET", "/v2/systemsharedmemory/status", shm_status, "Every registered system shared-memory region",
          "SharedMemoryStatus", tag="shared memory"),
    Route("GET", "/v2/systemsharedmemory/region/{region}/status", shm_status, "One registered region",
          "SharedMemoryStatus", tag="shared memory"),
    Route("POST", "/v2/systemsharedmemory/region/{region}/register", shm_register,
          "Register a region of a POSIX shared-memory object (key, offset, byte_size)", None,
          "SharedMemoryRegister", tag="shared memory"),
    Route("POST", "/v2/systemsharedmemory/region/{region}/unregister", shm_unregister,
          "Unregister a region (refused while a running request uses it)", tag="shared memory"),
    Route("POST", "/v2/systemsharedmemory/unregister", shm_unregister, "Unregister every region",
          tag="shared memory"),
    # text generation: generate_routes, openai_routes, tokenize_routes
    *(Route(*row) for row in GENERATE_ROUTES + OPENAI_ROUTES + RESPONSES_ROUTES + TOKENIZE_ROUTES),
    Route("GET", "/metrics", metrics, "Prometheus metrics", "PrometheusText", tag="operations"),
    Route("GET", "/openapi.json", openapi, "This OpenAPI 3 document", "OpenAPI", tag="operations"),
)


def is_public(path: str) -> bool:
    """Routes answered without a token: the health probes only."""
    return path.startswith("/v2/health/")


def add_routes(app: web.Application) -> None:
    for route in ROUTES:
        app.router.add_route(route.method, route.path, route.handler)
