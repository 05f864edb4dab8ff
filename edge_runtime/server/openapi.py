"""The OpenAPI 3 document of the server, built from the route table so no route goes undescribed."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from edge_runtime.protocol.codec import DATATYPES
from edge_runtime.server.errors import OPENAI_PATHS

if TYPE_CHECKING:
    from edge_runtime.server.routes import Route

_PARAMETER = re.compile(r"{(\w+)}")
_PARAM_DOCS = {"model": "Model name (^[A-Za-z0-9_.-]+$)", "version": "Model version (a positive integer)",
               "task_id": "Async task id, as returned by a 202 response",
               "region": "System shared-memory region name"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


_STR, _INT, _BOOL, _NUM = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "number"}
_SHAPE = {"type": "array", "items": {"type": "integer"}}
_PARAMS = {"type": "object", "additionalProperties": True}
_DURATION = _obj({"count": _INT, "ns": _INT}, ("count", "ns"))
_TENSOR_META = _obj({"name": _STR, "datatype": {"type": "string", "enum": sorted(DATATYPES)}, "shape": _SHAPE},
                    ("name", "datatype", "shape"))
_TENSOR = _obj({"name": _STR, "datatype": {"type": "string", "enum": sorted(DATATYPES)}, "shape": _SHAPE,
                "parameters": _obj({"binary_data_size": {"type": "integer", "minimum": 0},
                                    "shared_memory_region": _STR,
                                    "shared_memory_offset": {"type": "integer", "minimum": 0},
                                    "shared_memory_byte_size": {"type": "integer", "minimum": 0}}),
                "data": {"type": "array", "description": "row-major values, flat or nested"}},
               ("name", "datatype", "shape"))

_REGION = _obj({"name": _STR, "key": _STR, "offset": _INT, "byte_size": _INT}, ("name", "key", "offset", "byte_size"))

SCHEMAS: dict[str, Any] = {
    "Error": _obj({"error": _STR}, ("error",)),
    "OpenAIError": _obj({"error": _obj({"message": _STR, "type": _STR, "param": {"type": "string", "nullable": True},
                                        "code": {"type": "string", "nullable": True}}, ("message", "type"))},
                        ("error",)),
    "SharedMemoryStatus": {"type": "array", "items": _REGION},
    "SharedMemoryRegister": _obj({"key": {"type": "string", "description": "POSIX shm name, e.g. /input0"},
                                  "offset": {"type": "integer", "minimum": 0},
                                  "byte_size": {"type": "integer", "minimum": 1}}, ("key", "byte_size")),
    "ServerMetadata": _obj({"name": _STR, "version": _STR, "extensions": {"type": "array", "items": _STR}},
                           ("name", "version", "extensions")),
    "ModelMetadata": _obj({"name": _STR, "versions": {"type": "array", "items": _STR}, "platform": _STR,
                           "inputs": {"type": "array", "items": _TENSOR_META},
                           "outputs": {"type": "array", "items": _TENSOR_META}, "edge_runtime": _PARAMS},
                          ("name", "platform", "inputs", "outputs")),
    "ModelConfig": _obj({"name": _STR, "platform": _STR, "backend": _STR, "max_batch_size": _INT,
                         "input": {"type": "array", "items": _TENSOR_META},
                         "output": {"type": "array", "items": _TENSOR_META}}, ("name", "input", "output")),
    "InferenceRequest": _obj({
        "id": _STR,
        "parameters": _obj({"priority": {"type": "integer", "minimum": 0,
                                         "description": "Triton semantics: 1 most urgent; 0 = server default"},
                            "timeout": {"type": "integer", "minimum": 0, "description": "microseconds"},
                            "binary_data_output": _BOOL,
                            "async": {"type": "boolean", "description": "answer 202 with a task"}}),
        "inputs": {"type": "array", "items": _TENSOR, "minItems": 1},
        "outputs": {"type": "array", "items": _obj({"name": _STR, "parameters": _obj({
            "binary_data": _BOOL, "shared_memory_region": _STR, "shared_memory_offset": _INT,
            "shared_memory_byte_size": _INT})},
                                                   ("name",))},
    }, ("inputs",)),
    "InferenceResponse": _obj({"model_name": _STR, "model_version": _STR, "id": _STR, "parameters": {
        "type": "object", "additionalProperties": True, "properties": {
            "plan": _STR, "backends": _STR, "ran_on": {"type": "string", "enum": ["local", "cloud", "split"]},
            "queue_us": _INT, "compute_us": _INT, "batch_size": _INT, "retried": _BOOL, "ran_twice": _BOOL,
            "fallback": _STR, "route": _STR}},
                               "outputs": {"type": "array", "items": _TENSOR}}, ("model_name", "outputs")),
    "RepositoryIndexRequest": _obj({"ready": _BOOL}),
    "RepositoryIndex": {"type": "array", "items": _obj(
        {"name": _STR, "version": _STR, "state": {"type": "string", "enum": ["READY", "UNAVAILABLE"]},
         "reason": _STR}, ("name",))},
    "LoadRequest": _obj({"parameters": _PARAMS}),
    "LoadResponse": _obj({"name": _STR, "versions": {"type": "array", "items": _STR}}, ("name",)),
    "ModelStats": _obj({"model_stats": {"type": "array", "items": _obj({
        "name": _STR, "version": _STR, "last_inference": _INT, "inference_count": _INT, "execution_count": _INT,
        "inference_stats": _obj({k: _DURATION for k in ("success", "fail", "queue", "compute_input",
                                                         "compute_infer", "compute_output")}),
        "batch_stats": {"type": "array", "items": _obj({"batch_size": _INT, "compute_infer": _DURATION})},
    }, ("name", "version", "inference_count", "execution_count", "inference_stats"))}}, ("model_stats",)),
    "Task": _obj({"id": _STR, "status": {"type": "string", "enum": ["pending", "succeeded", "failed", "cancelled"]},
                  "model_name": _STR, "model_version": _STR, "created": _NUM, "finished": _NUM,
                  "result_url": _STR, "response": _ref("InferenceResponse"), "error": _STR,
                  "error_status": _INT}, ("id", "status", "model_name", "model_version", "result_url")),
    "PrometheusText": {"type": "string"},
    "OpenAPI": {"type": "object"},
}

_ERRORS = {
    "400": "Client mistake: malformed JSON, wrong datatype or shape, unknown input or output",
    "401": "Missing or wrong bearer token (when the server has one)",
    "404": "Unknown model, version, task or route",
    "413": "Request body larger than max_body_bytes",
    "429": "Queue full (or 503, per overload_status); see Retry-After",
    "502": "The cloud peer failed and nothing local could answer",
    "503": "Backend failed with no fallback, or the server is shutting down",
    "504": "The request's deadline (timeout) passed",
}


def _content(schema: str, binary: bool = False) -> dict[str, Any]:
    if schema == "PrometheusText":
        return {"text/plain": {"schema": _ref(schema)}}
    content: dict[str, Any] = {"application/json": {"schema": _ref(schema)}}
    if binary:
        content["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
    return content


def _operation(route: "Route", public: bool) -> dict[str, Any]:
    inference = route.body == "InferenceRequest"
    ok: dict[str, Any] = {"description": route.summary}
    if route.ok:
        ok["content"] = _content(route.ok, binary=route.ok == "InferenceResponse")
    responses: dict[str, Any] = {"200": ok}
    if inference:
        responses["202"] = {"description": "Accepted as an async task", "content": _content("Task"),
                            "headers": {"Location": {"schema": _STR}}}
    error = {"content": _content("OpenAIError" if route.path.startswith(OPENAI_PATHS) else "Error")}
    for status, text in _ERRORS.items():
        if status == "401" and public:
            continue
        responses[status] = {"description": text, **error}
    operation: dict[str, Any] = {
        "operationId": route.method.lower() + "_" + re.sub(r"[^A-Za-z0-9]+", "_", route.path).strip("_"),
        "summary": route.summary, "tags": [route.tag], "responses": responses,
        "parameters": [{"name": p, "in": "path", "required": True, "description": _PARAM_DOCS.get(p, p),
                        "schema": _STR} for p in _PARAMETER.findall(route.path)],
    }
    if inference:
        operation["parameters"] += [
            {"name": "Inference-Header-Content-Length", "in": "header", "required": False, "schema": _INT,
             "description": "binary tensor extension: length of the JSON header that starts the body"},
            {"name": "Prefer", "in": "header", "required": False, "schema": _STR,
             "description": "'respond-async' answers 202 with a task"}]
    if route.body:
        operation["requestBody"] = {"required": inference, "content": _content(route.body, binary=inference)}
    if public:
        operation["security"] = []
    return operation


def openapi_document(routes: tuple["Route", ...], version: str) -> dict[str, Any]:
    """OpenAPI 3.0 document describing ``routes``."""
    from edge_runtime.server.routes import is_public

    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, is_public(route.path))
    return {
        "openapi": "3.0.3",
        "info": {"title": "edge-runtime inference server", "version": version,
                 "description": "KServe v2 / Open Inference Protocol with Triton's binary tensor, statistics "
                                "and repository extensions, plus async tasks."},
        "paths": paths,
        "components": {"schemas": SCHEMAS,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }
