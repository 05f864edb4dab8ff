"""The one status table (the conventions note is the oracle) and how failures reach the wire."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pytest

from edge_runtime import errors
from edge_runtime.protocol import codec
from edge_runtime.server.errors import (
    RequestTooLargeError,
    TaskNotFoundError,
    TaskStateError,
    UnauthorizedError,
    error_headers,
    mapping_of,
    public_message,
)


@pytest.mark.parametrize("error, status", [
    (errors.InvalidInputError("x"), 400), (errors.ConfigError("x"), 400), (errors.ModelLoadError("x"), 400),
    (errors.UnsupportedNodesError("opencl", ["n (Op)"]), 400), (errors.ModelNotFoundError("x"), 404),
    (TaskNotFoundError("x"), 404), (RequestTooLargeError("x"), 413), (UnauthorizedError("x"), 401),
    (TaskStateError("x"), 409), (errors.QueueFullError("x"), 429), (errors.DeadlineExceededError("x"), 504),
    (errors.CloudError("x"), 502), (errors.BackendError("x"), 503), (errors.BackendUnavailableError("x"), 503),
    (errors.EdgeRuntimeError("shutting down"), 503), (RuntimeError("bug"), 500),
])
def test_status_table_matches_the_wire_conventions(error: Exception, status: int) -> None:
    assert mapping_of(error).status == status


def test_overload_status_is_configurable_and_always_has_retry_after() -> None:
    assert mapping_of(errors.QueueFullError("x"), overload_status=503).status == 503
    assert error_headers(errors.QueueFullError("x"), retry_after_s=7) == {"Retry-After": "7"}
    assert error_headers(errors.InvalidInputError("x"), retry_after_s=7) == {}


def test_a_bug_never_leaks_its_message() -> None:
    assert "secret" not in public_message(KeyError("secret internals"))
    assert public_message(errors.InvalidInputError("input 'x': bad")) == "input 'x': bad"


@dataclass(frozen=True)
class FailingPlan:
    error: Exception
    name: str = "cpu"
    backends: tuple[str, ...] = ("cpu",)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise self.error


def failing_plans(error: Exception) -> Any:
    def extra_plans(model: Any) -> dict[str, Any]:
        return {"cpu": FailingPlan(error)} if model.name == "mlp" else {}
    return extra_plans


@pytest.mark.parametrize("error, status, shown", [
    (KeyError("secret internals"), 500, "internal server error"),
    (errors.BackendError("cpu: out of memory"), 503, "cpu: out of memory"),
])
async def test_run_failures_map_to_status_and_the_server_keeps_serving(aiohttp_client: Any, make_app: Any,
                                                                       error: Exception, status: int,
                                                                       shown: str) -> None:
    client = await aiohttp_client(make_app(extra_plans=failing_plans(error)))
    body = codec.encode_request({"input": np.zeros((1, 64), np.float32)}).body
    response = await client.post("/v2/models/mlp/infer", data=body)
    assert response.status == status
    message = (await response.json())["error"]
    assert shown in message and "secret" not in message and "Traceback" not in message
    other = await client.post("/v2/models/slow/infer", data=body)  # other models are not poisoned
    assert other.status == 200
