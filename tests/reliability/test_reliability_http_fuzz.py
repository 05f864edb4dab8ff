"""The HTTP API under hostile input: Schemathesis driven from the server's own ``/openapi.json``, and
Hypothesis-built inference and generation bodies, against the real aiohttp app on loopback.

Expected of every answer: a 2xx, or a 4xx whose JSON body names what was wrong
(429/503 only with ``Retry-After``); never a 5xx for client input. A streamed
generation answer is whole server-sent events ending with ``[DONE]`` (OpenAI
routes) or a finishing event (``generate_stream``), never an error event.
Afterwards the worker still serves a correct inference (ONNX Runtime is the
oracle) and the same greedy text as the model called in process.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import requests
import schemathesis
from hypothesis import given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from edge_runtime.protocol import codec
from reliability_fixtures import AUTH, CHAT, StreamResult, _take, assert_names_the_problem, mlp_feeds, scaled
from server_fixtures import ort_run
from test_reliability_codec_fuzz import JSON_VALUES, hostile_requests

def _ensure_loaded(base: str) -> None:
    """The fuzzers call unload too (a legitimate request): later tests load what they use again."""
    for name in ("mlp", "types", "chat"):
        if _session.get(f"{base}/v2/models/{name}/ready", timeout=30).status_code != 200:
            assert _session.post(f"{base}/v2/repository/models/{name}/load", timeout=120).status_code == 200


SERVED = ("mlp", "types", "gated", "chat", "nope", "..", "a%2Fb")  # real models, an unknown one, hostile names
_session = requests.Session()  # the other tests: always with the token
_session.headers.update(AUTH)
_schemathesis_session = requests.Session()  # the token only where the generated case carries one
SCHEMA_EXAMPLES = scaled(12)  # per operation and generation mode


def _operations() -> list[Any]:
    """The API's operations, read from the same document ``/openapi.json`` serves (built from the route table)."""
    import edge_runtime
    from edge_runtime.server.openapi import openapi_document
    from edge_runtime.server.routes import ROUTES

    loaded = schemathesis.openapi.from_dict(openapi_document(ROUTES, edge_runtime.__version__))
    return [result.ok() for result in loaded.get_all_operations()]


OPERATIONS = _operations()
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)


def error_bodies_name_the_problem(ctx: Any, response: Any, case: Any) -> bool | None:
    """Our own check: every error answer says what was wrong; overload answers say when to retry."""
    if response.status_code >= 400:
        assert_names_the_problem(response.status_code, response.content, f"{case.method} {case.formatted_path}")
    if response.status_code in (429, 503) and "/health/" not in case.formatted_path:
        assert "Retry-After" in response.headers, f"{response.status_code} without Retry-After"
    return None


def test_the_served_document_is_the_one_fuzzed(rel_live: Any) -> None:
    served = _session.get(f"http://{rel_live.url}/openapi.json", timeout=30).json()
    assert sorted(f"{m.upper()} {p}" for p, item in served["paths"].items() for m in item) == sorted(
        op.label for op in OPERATIONS)


# NOTE: Schemathesis' own pytest plugin does not run under pytest 9 yet ('Function' has no '_nodeid'), so the
# operations' Hypothesis strategies are driven here directly; its checks validate every response.
@pytest.mark.parametrize("operation, mode", [
    (op, mode) for op in OPERATIONS for mode in MODES
    if mode is GenerationMode.POSITIVE or "/health/" not in op.path],  # nothing in a health probe to negate
    ids=lambda v: v.label if hasattr(v, "label") else v.value)
def test_every_route_answers_2xx_or_a_named_4xx(operation: Any, mode: Any, rel_live: Any) -> None:
    base_url = f"http://{rel_live.url}"
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    if mode is GenerationMode.NEGATIVE:
        checks.append(negative_data_rejection)

    @given(case=operation.as_strategy(generation_mode=mode), model=st.sampled_from(SERVED))
    @settings(max_examples=SCHEMA_EXAMPLES)
    def run(case: Any, model: str) -> None:
        if "model" in (case.path_parameters or {}):
            case.path_parameters["model"] = model  # reach the real models too, not only random names
        if case.headers and "Authorization" in case.headers:
            case.headers["Authorization"] = AUTH["Authorization"]  # a negative case may drop or mangle it
        case.call_and_validate(base_url=base_url, session=_schemathesis_session, timeout=30, checks=checks,
                               additional_checks=[error_bodies_name_the_problem])

    run()


@given(hostile_requests(), st.sampled_from(("mlp", "types")), st.booleans())
@settings(max_examples=scaled(150))
def test_hostile_inference_bodies_get_a_named_4xx(rel_live: Any, request_body: tuple[bytes, int | None],
                                                  model: str, as_async: bool) -> None:
    _ensure_loaded(f"http://{rel_live.url}")
    body, header_length = request_body
    headers = {} if header_length is None else {"Inference-Header-Content-Length": str(header_length)}
    if as_async:
        headers["Prefer"] = "respond-async"
    response = _session.post(f"http://{rel_live.url}/v2/models/{model}/infer", data=body, headers=headers, timeout=30)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert_names_the_problem(response.status_code, response.content, "infer")


# -- generation bodies ----------------------------------------------------------------------------
# A valid request of each route (the context is 96 tokens), then, half the time, one field replaced
# by a hostile value: most examples get past parsing into tokenising, sampling and streaming.
NEAR_VALID = st.sampled_from([0, -1, 2**31, 2**63, 2**64, 1e308, float("nan"), float("inf"), -0.0, "", "1", [], {},
                              True, False, None, [None], ["x"] * 50])
HOSTILE = st.one_of(NEAR_VALID, JSON_VALUES)
MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                           "content": st.text(max_size=30)}), min_size=1, max_size=3)
SAMPLING = {"max_tokens": st.integers(1, 12), "temperature": st.floats(0, 2), "top_p": st.floats(0, 1),
            "seed": st.integers(0, 2**31), "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3),
                                                                                            max_size=4)),
            "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
            "ignore_eos": st.booleans(), "n": st.just(1)}
STREAM_OPTIONS = {"stream_options": st.fixed_dictionaries({"include_usage": st.booleans()})}
ROUTE_BODIES = (  # path, required fields, optional fields
    ("/v1/chat/completions", {"model": st.just("chat"), "messages": MESSAGES, "stream": st.booleans()},
     {**SAMPLING, **STREAM_OPTIONS, "logprobs": st.booleans(), "top_logprobs": st.integers(0, 5),
      "max_completion_tokens": st.integers(1, 12), "response_format": st.just({"type": "text"}),
      "async": st.just(True)}),
    ("/v1/completions", {"model": st.just("chat"), "stream": st.booleans(),
                         "prompt": st.one_of(st.text(max_size=40), st.lists(st.integers(0, 599), min_size=1,
                                                                            max_size=20))},
     {**SAMPLING, **STREAM_OPTIONS, "logprobs": st.integers(0, 5), "echo": st.booleans()}),
    ("/v1/responses", {"model": st.just("chat"), "input": st.one_of(st.text(max_size=40), MESSAGES),
                       "stream": st.booleans()},
     {"max_output_tokens": st.integers(1, 12), "temperature": st.floats(0, 2), "top_p": st.floats(0, 1),
      "instructions": st.text(max_size=30), "seed": st.integers(0, 2**31), "ignore_eos": st.booleans(),
      "text": st.just({"format": {"type": "text"}}), "store": st.booleans(), "metadata": st.just({"k": "v"})}),
    ("/v2/models/chat/generate", {"text_input": st.text(max_size=40)},
     {"parameters": st.fixed_dictionaries({}, optional=SAMPLING), **SAMPLING}),
    ("/v2/models/chat/generate_stream", {"text_input": st.text(max_size=40)},
     {"parameters": st.fixed_dictionaries({}, optional=SAMPLING), **SAMPLING}),
)


@st.composite
def generation_requests(draw: Any) -> tuple[str, dict[str, Any]]:
    path, required, optional = draw(st.sampled_from(ROUTE_BODIES))
    body = draw(st.fixed_dictionaries(required, optional=optional))
    if draw(st.booleans()):
        body[draw(st.sampled_from(sorted({**required, **optional})))] = draw(HOSTILE)
    return path, body


def _sse(body: bytes) -> StreamResult:
    result = StreamResult(200)
    *blocks, rest = body.split(b"\n\n")
    for block in blocks:
        _take(result, block)
    result.truncated = rest.strip()
    return result


@given(generation_requests())
@settings(max_examples=scaled(100))
def test_hostile_generation_bodies_get_a_2xx_or_a_named_4xx(rel_live: Any,
                                                             request_body: tuple[str, dict[str, Any]]) -> None:
    _ensure_loaded(f"http://{rel_live.url}")
    path, body = request_body
    response = _session.post(f"http://{rel_live.url}{path}", data=json.dumps(body), timeout=60,
                             headers={"Content-Type": "application/json"})
    assert response.status_code < 500, (path, body, response.text[:500])
    if response.status_code >= 400:
        assert_names_the_problem(response.status_code, response.content, path)
        assert response.status_code != 429 or "Retry-After" in response.headers
        return
    if response.headers.get("Content-Type", "").startswith("text/event-stream"):
        result = _sse(response.content)
        assert not result.truncated and result.after_done == 0 and result.error is None, (body, result)
        if path == "/v1/responses":  # its stream ends with a typed terminal event, no [DONE]
            assert result.events[-1].get("type") in ("response.completed", "response.incomplete"), (body, result)
        else:
            assert result.done if path.startswith("/v1/") else result.finish_reason, (body, result.events[-1:])
    elif response.status_code == 202:  # "async": true: the task finishes, its result is the answer or a 4xx
        task = response.json()
        for _ in range(1000):
            if _session.get(f"http://{rel_live.url}/v2/tasks/{task['id']}", timeout=30).json()["status"] != "pending":
                break
        result = _session.get(f"http://{rel_live.url}/v2/tasks/{task['id']}/result", timeout=30)
        assert result.status_code == 200 or 400 <= result.status_code < 500, (body, result.text[:300])
    else:
        assert response.status_code == 200 and isinstance(response.json(), dict), response.text[:300]


HOSTILE_NAMES = ("..", ".", "../../etc/passwd", "a/../b", "\\..\\x", "²", "١٢", "9" * 5000, "0", "-1", "1.5",
                 " 1", "1\n", "\x00", "%00", "mlp\x00", "~root", "$(id)", "mlp;rm", "C:", "*", "a" * 300)


@given(st.one_of(st.sampled_from(HOSTILE_NAMES), st.text(min_size=1, max_size=40)),
       st.sampled_from(("", "/ready", "/config", "/stats", "/infer")))
@settings(max_examples=scaled(80))
def test_odd_model_version_and_task_names_are_refused_cleanly(rel_live: Any, name: str, suffix: str) -> None:
    """Names straight into URL paths (percent-encoded): 4xx, never a 5xx, never a file outside the repository."""
    quoted = requests.utils.quote(name, safe="")
    for path in (f"/v2/models/{quoted}{suffix}", f"/v2/models/mlp/versions/{quoted}{suffix}",
                 f"/v2/tasks/{quoted}", f"/v2/repository/models/{quoted}/load"):
        method = "POST" if path.endswith(("/infer", "/load")) else "GET"
        response = _session.request(method, f"http://{rel_live.url}{path}", timeout=30, data=b"")
        assert response.status_code < 500, (path, response.text)
        if response.status_code >= 400:
            assert_names_the_problem(response.status_code, response.content, path)


@pytest.mark.parametrize("header_length", ["²", "9" * 5000, "-1", "1e3", "0x10", "", "1 2", "¹"])
def test_odd_header_lengths_are_a_named_400(rel_live: Any, header_length: str) -> None:
    _ensure_loaded(f"http://{rel_live.url}")
    body = codec.encode_request(mlp_feeds(0), binary=True).body
    response = _session.post(f"http://{rel_live.url}/v2/models/mlp/infer", data=body, timeout=30,
                             headers={"Inference-Header-Content-Length": header_length})
    assert response.status_code == 400, response.text
    assert "Inference-Header-Content-Length" in response.json()["error"]


def test_the_worker_still_serves_correctly_after_the_fuzzers(rel_live: Any, rel_repo: Any) -> None:
    base = f"http://{rel_live.url}"
    assert _session.get(f"{base}/v2/health/live", timeout=30).status_code == 200
    assert _session.get(f"{base}/v2/health/ready", timeout=30).status_code == 200
    _ensure_loaded(base)
    feeds = mlp_feeds(7, rows=3)
    encoded = codec.encode_request(feeds, binary=True)
    response = _session.post(f"{base}/v2/models/mlp/infer", data=encoded.body, timeout=30,
                             headers={"Inference-Header-Content-Length": str(encoded.header_length)})
    assert response.status_code == 200, response.text
    (output,) = json.loads(response.content)["outputs"]
    expected = ort_run(rel_repo / "mlp" / "1" / "model.onnx", feeds)
    np.testing.assert_allclose(np.array(output["data"], np.float32).reshape(output["shape"]),
                               next(iter(expected.values())), rtol=1e-5, atol=1e-6)
    # The decoder too: the greedy answer over HTTP is the one of the model called in process.
    from edge_runtime.server.state import STATE

    answer = _session.post(f"{base}/v1/chat/completions", timeout=60, json={
        "model": "chat", "messages": CHAT, "max_tokens": 12, "temperature": 0}).json()
    model = rel_live.app[STATE].repository.get("chat").model
    assert answer["choices"][0]["message"]["content"] == model.generate(messages=CHAT, max_tokens=12).text
    metrics = _session.get(f"{base}/metrics", timeout=30).text
    assert 'reason="OTHER"' not in metrics or "nv_inference_request_failure" in metrics  # scrape still works
