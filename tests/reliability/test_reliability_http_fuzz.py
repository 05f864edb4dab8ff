"""The HTTP API under hostile input: Schemathesis driven from the server's own ``/openapi.json``, and
Hypothesis-built inference bodies, against the real aiohttp app on loopback.

Expected of every answer: a 2xx, or a 4xx whose JSON body names what was wrong
(429/503 only with ``Retry-After``); never a 5xx for client input. Afterwards the
worker still serves a correct inference (ONNX Runtime is the oracle).
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
from reliability_fixtures import AUTH, assert_names_the_problem, mlp_feeds, scaled
from server_fixtures import ort_run
from test_reliability_codec_fuzz import hostile_requests

def _ensure_loaded(base: str) -> None:
    """The fuzzers call unload too (a legitimate request): later tests load what they use again."""
    for name in ("mlp", "types"):
        if _session.get(f"{base}/v2/models/{name}/ready", timeout=30).status_code != 200:
            assert _session.post(f"{base}/v2/repository/models/{name}/load", timeout=120).status_code == 200


SERVED = ("mlp", "types", "gated", "nope", "..", "a%2Fb")  # real models, an unknown one, hostile names
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
    metrics = _session.get(f"{base}/metrics", timeout=30).text
    assert 'reason="OTHER"' not in metrics or "nv_inference_request_failure" in metrics  # scrape still works
