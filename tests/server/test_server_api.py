"""Core routes through aiohttp's test client against the real app: metadata, health, inference, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.protocol import codec
from server_fixtures import ort_run, type_feeds


async def test_server_metadata_advertises_extensions(client: Any) -> None:
    response = await client.get("/v2")
    assert response.status == 200
    body = await response.json()
    assert body["name"] == "edge-runtime"
    assert {"binary_tensor_data", "model_repository", "statistics", "schedule_policy"} <= set(body["extensions"])


async def test_health_live_and_ready(client: Any) -> None:
    assert (await client.get("/v2/health/live")).status == 200
    assert (await client.get("/v2/health/ready")).status == 200


async def test_model_metadata_reports_datatypes_and_dynamic_dims(client: Any) -> None:
    body = await (await client.get("/v2/models/mlp")).json()
    assert body["name"] == "mlp" and body["versions"] == ["1", "2"]
    assert body["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert body["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    types = await (await client.get("/v2/models/types/versions/1")).json()
    datatypes = {t["name"]: t["datatype"] for t in types["inputs"]}
    assert datatypes == {"x_b": "BOOL", "x_u8": "UINT8", "x_u16": "UINT16", "x_u32": "UINT32", "x_u64": "UINT64",
                         "x_i8": "INT8", "x_i16": "INT16", "x_i32": "INT32", "x_i64": "INT64", "x_f16": "FP16",
                         "x_f32": "FP32", "x_f64": "FP64", "x_s": "BYTES"}


async def test_model_ready_and_unknown_model(client: Any) -> None:
    assert (await client.get("/v2/models/mlp/ready")).status == 200
    assert (await client.get("/v2/models/mlp/versions/1/ready")).status == 200
    response = await client.get("/v2/models/absent/ready")
    assert response.status == 404
    assert "unknown model 'absent'" in (await response.json())["error"]


def mlp_feeds(rows: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)}


async def post_infer(client: Any, path: str, inputs: dict[str, np.ndarray], binary: bool = False,
                     **header: Any) -> Any:
    encoded = codec.encode_request(inputs, binary=binary)
    document = json.loads(encoded.body[:encoded.header_length] if binary else encoded.body)
    document.update(header)
    head = json.dumps(document).encode()
    body = head + (encoded.body[encoded.header_length:] if binary else b"")
    headers = {"Inference-Header-Content-Length": str(len(head))} if binary else {}
    return await client.post(path, data=body, headers=headers)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
async def test_infer_equals_onnxruntime_and_echoes_id(client: Any, repo: Path, binary: bool) -> None:
    feeds = mlp_feeds()
    response = await post_infer(client, "/v2/models/mlp/versions/1/infer", feeds, binary=binary, id="req-1",
                                parameters={"binary_data_output": binary})
    assert response.status == 200, await response.text()
    raw = await response.read()
    header_length = response.headers.get("Inference-Header-Content-Length")
    assert (header_length is not None) == binary
    import tritonclient.http as triton

    result = triton.InferenceServerClient.parse_response_body(raw, header_length=header_length and int(header_length))
    assert result.get_response()["id"] == "req-1"
    assert result.get_response()["model_version"] == "1"
    expected = ort_run(repo / "mlp" / "1" / "model.onnx", feeds)["logits"]
    np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=1e-5, atol=1e-6)


async def test_infer_without_version_uses_the_highest(client: Any, repo: Path) -> None:
    feeds = mlp_feeds(seed=4)
    body = await (await post_infer(client, "/v2/models/mlp/infer", feeds)).json()
    assert body["model_version"] == "2"
    got = np.array(body["outputs"][0]["data"], np.float32).reshape(body["outputs"][0]["shape"])
    np.testing.assert_allclose(got, ort_run(repo / "mlp" / "2" / "model.onnx", feeds)["logits"], rtol=1e-5, atol=1e-6)
    assert not np.allclose(got, ort_run(repo / "mlp" / "1" / "model.onnx", feeds)["logits"], atol=1e-3)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
async def test_every_datatype_round_trips_through_the_model(client: Any, repo: Path, binary: bool) -> None:
    feeds = type_feeds(seed=3)
    wire = {k: (v if v.dtype != object else v.astype(str).astype(object)) for k, v in feeds.items()}
    response = await post_infer(client, "/v2/models/types/infer", wire, binary=binary,
                                parameters={"binary_data_output": binary})
    assert response.status == 200, await response.text()
    raw = await response.read()
    header_length = response.headers.get("Inference-Header-Content-Length")
    import tritonclient.http as triton

    result = triton.InferenceServerClient.parse_response_body(raw, header_length=header_length and int(header_length))
    expected = ort_run(repo / "types" / "1" / "model.onnx", feeds)
    for name, want in expected.items():
        got = result.as_numpy(name)
        if want.dtype == object:
            got = np.array([g.decode() if isinstance(g, bytes) else g for g in got.ravel()], object).reshape(got.shape)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype


async def test_requested_outputs_subset_and_per_output_binary(client: Any) -> None:
    feeds = {k: v for k, v in type_feeds().items()}
    encoded = codec.encode_request(feeds)
    document = json.loads(encoded.body)
    document["outputs"] = [{"name": "y_i32", "parameters": {"binary_data": True}}, {"name": "y_f64"}]
    response = await client.post("/v2/models/types/infer", data=json.dumps(document))
    assert response.status == 200
    length = int(response.headers["Inference-Header-Content-Length"])
    raw = await response.read()
    header = json.loads(raw[:length])
    assert [o["name"] for o in header["outputs"]] == ["y_i32", "y_f64"]
    np.testing.assert_array_equal(np.frombuffer(raw[length:], "<i4").reshape(2, 3), feeds["x_i32"])
    np.testing.assert_array_equal(np.array(header["outputs"][1]["data"]).reshape(2, 3), feeds["x_f64"])


def infer_body(name: str = "input", datatype: str = "FP32", shape: list[int] | None = None,
               data: Any = None, **extra: Any) -> str:
    shape = [1, 64] if shape is None else shape
    data = [0.5] * int(np.prod(shape)) if data is None else data
    return json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}], **extra})


BAD_REQUESTS = [
    ("mlp", "{bad json", {}, 400, "malformed JSON"),
    ("mlp", infer_body(datatype="INT64", data=[1] * 64), {}, 400, "expects datatype FP32, the request sent INT64"),
    ("mlp", infer_body(datatype="BYTES", data=["a"] * 64), {}, 400, "expects datatype FP32, the request sent BYTES"),
    ("mlp", infer_body(data=[0.5] * 63), {}, 400, r"shape [1, 64] needs 64 elements, 'data' has 63"),
    ("mlp", infer_body(shape=[1, 63]), {}, 400, "'input': dimension 1 must be 64"),
    ("mlp", infer_body(name="image"), {}, 400, "unknown input 'image'"),
    ("types", infer_body(name="x_f32", shape=[2, 3]), {}, 400, "missing input(s)"),
    ("mlp", infer_body(outputs=[{"name": "nope"}]), {}, 400, "unknown output(s) ['nope']"),
    ("mlp", infer_body(parameters={"priority": -2}), {}, 400, "priority must be an integer >= 0"),
    ("mlp", infer_body(parameters={"timeout": "soon"}), {}, 400, "timeout must be microseconds"),
    ("mlp", infer_body(parameters={"async": "yes"}), {}, 400, "async must be true or false"),
    ("mlp", infer_body(), {"Inference-Header-Content-Length": "x"}, 400, "must be a non-negative integer"),
    ("mlp", infer_body(), {"Inference-Header-Content-Length": "99999"}, 400, "Inference-Header-Content-Length is"),
    ("absent", infer_body(), {}, 404, "unknown model 'absent'"),
    ("mlp/versions/7", infer_body(), {}, 404, "has no version 7 loaded"),
    ("mlp/versions/x", infer_body(), {}, 400, "invalid model version 'x'"),
    ("bad$name", infer_body(), {}, 400, "invalid model name"),
]


@pytest.mark.parametrize("model, body, headers, status, message", BAD_REQUESTS,
                         ids=[f"{i}-{case[4][:30]}" for i, case in enumerate(BAD_REQUESTS)])
async def test_client_mistakes_get_4xx_naming_the_problem(client: Any, model: str, body: str,
                                                          headers: dict[str, str], status: int, message: str) -> None:
    response = await client.post(f"/v2/models/{model}/infer", data=body, headers=headers)
    assert response.status == status
    assert response.content_type == "application/json"
    error = (await response.json())["error"]
    assert message in error
    assert "Traceback" not in error


async def test_bad_binary_data_size_is_a_400(client: Any) -> None:
    head = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                                   "parameters": {"binary_data_size": 256}}]}).encode()
    response = await client.post("/v2/models/mlp/infer", data=head + b"\0" * 200,
                                 headers={"Inference-Header-Content-Length": str(len(head))})
    assert response.status == 400
    assert "runs past the body" in (await response.json())["error"]


async def test_too_large_body_is_413(aiohttp_client: Any, make_app: Any) -> None:
    client = await aiohttp_client(make_app(max_body_bytes=200))
    response = await client.post("/v2/models/mlp/infer", data=infer_body())
    assert response.status == 413
    assert "limit is 200" in (await response.json())["error"]

    async def chunks() -> Any:  # no Content-Length: aiohttp stops reading at the limit
        for _ in range(4):
            yield infer_body().encode()[:100]

    response = await client.post("/v2/models/mlp/infer", data=chunks())
    assert response.status == 413
    assert "Maximum request body size 200 exceeded" in (await response.json())["error"]


async def test_unknown_route_and_method_answer_json(client: Any) -> None:
    response = await client.get("/v3/nothing")
    assert response.status == 404 and "error" in await response.json()
    response = await client.delete("/v2")
    assert response.status == 405 and "error" in await response.json()
    assert "GET" in response.headers["Allow"]


async def test_openapi_describes_every_route_and_validates(client: Any) -> None:
    from openapi_spec_validator import validate

    document = await (await client.get("/openapi.json")).json()
    validate(document)
    for resource in client.app.router.resources():
        path = resource.canonical
        methods = {route.method.lower() for route in resource if route.method != "HEAD"}
        assert path in document["paths"], path
        assert methods <= set(document["paths"][path]), (path, methods)


def resolve(schema: Any, document: dict[str, Any]) -> Any:
    """Inline ``$ref``s so a plain JSON-schema validator can check a response."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            return resolve(document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]], document)
        return {k: resolve(v, document) for k, v in schema.items()}
    if isinstance(schema, list):
        return [resolve(v, document) for v in schema]
    return schema


async def test_responses_match_their_openapi_schemas(client: Any) -> None:
    from openapi_schema_validator import OAS30Validator

    document = await (await client.get("/openapi.json")).json()
    await post_infer(client, "/v2/models/mlp/infer", mlp_feeds())

    async def check(method: str, url: str, template: str, status: int = 200, **kwargs: Any) -> None:
        response = await client.request(method, url, **kwargs)
        assert response.status == status
        operation = document["paths"][template][method.lower()]
        schema = operation["responses"][str(status)]["content"]["application/json"]["schema"]
        OAS30Validator(resolve(schema, document)).validate(await response.json())

    await check("GET", "/v2", "/v2")
    await check("GET", "/v2/models/mlp", "/v2/models/{model}")
    await check("GET", "/v2/models/mlp/config", "/v2/models/{model}/config")
    await check("GET", "/v2/models/mlp/versions/2/stats", "/v2/models/{model}/versions/{version}/stats")
    await check("POST", "/v2/repository/index", "/v2/repository/index")
    await check("POST", "/v2/models/mlp/infer", "/v2/models/{model}/infer", data=infer_body())
    await check("POST", "/v2/models/mlp/infer", "/v2/models/{model}/infer", 400, data="{")
