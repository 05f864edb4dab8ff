"""Async tasks: submit (parameter or Prefer header), poll, fetch the result, cancel, bounds and TTL."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.protocol import codec
from server_fixtures import ort_run


def feeds(seed: int = 0) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(seed).standard_normal((1, 64)).astype(np.float32)}


async def submit(client: Any, model: str = "slow", seed: int = 0, header: bool = True, **parameters: Any) -> Any:
    if not header:
        parameters["async"] = True
    body = codec.encode_request(feeds(seed), parameters=parameters or None).body
    headers = {"Prefer": "respond-async"} if header else {}
    return await client.post(f"/v2/models/{model}/infer", data=body, headers=headers)


async def wait_for(client: Any, task_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        document = await (await client.get(f"/v2/tasks/{task_id}")).json()
        if document["status"] != "pending":
            return document
        await asyncio.sleep(0.02)
    raise AssertionError(f"task {task_id} still pending after {timeout_s} s")


@pytest.mark.parametrize("header", [True, False], ids=["prefer-header", "async-parameter"])
async def test_task_lifecycle_returns_the_same_result_as_onnxruntime(client: Any, repo: Path, header: bool) -> None:
    response = await submit(client, seed=1, header=header)
    assert response.status == 202
    task = await response.json()
    assert response.headers["Location"] == f"/v2/tasks/{task['id']}"
    assert task["status"] == "pending" and task["model_name"] == "slow"
    assert ("Preference-Applied" in response.headers) == header
    pending = await client.get(f"/v2/tasks/{task['id']}/result")
    assert pending.status == 409 and "pending" in (await pending.json())["error"]
    done = await wait_for(client, task["id"])
    assert done["status"] == "succeeded"
    expected = ort_run(repo / "slow" / "1" / "model.onnx", feeds(1))["logits"]
    inline = done["response"]["outputs"][0]
    np.testing.assert_allclose(np.array(inline["data"], np.float32).reshape(inline["shape"]), expected,
                               rtol=1e-5, atol=1e-6)
    result = await client.get(done["result_url"])
    assert result.status == 200
    assert (await result.json())["outputs"] == done["response"]["outputs"]


async def test_binary_task_result_is_served_verbatim(client: Any, repo: Path) -> None:
    task = await (await submit(client, model="mlp", seed=2, binary_data_output=True)).json()
    done = await wait_for(client, task["id"])
    assert done["status"] == "succeeded" and "response" not in done  # binary: fetch it from result_url
    result = await client.get(done["result_url"])
    length = int(result.headers["Inference-Header-Content-Length"])
    raw = await result.read()
    got = np.frombuffer(raw[length:], "<f4").reshape(1, 10)
    np.testing.assert_allclose(got, ort_run(repo / "mlp" / "2" / "model.onnx", feeds(2))["logits"],
                               rtol=1e-5, atol=1e-6)


async def test_cancel_a_pending_task_then_forget_it(client: Any) -> None:
    running = await (await submit(client, seed=0)).json()
    queued = await (await submit(client, seed=1)).json()
    cancelled = await client.delete(f"/v2/tasks/{queued['id']}")
    assert cancelled.status == 200 and (await cancelled.json())["status"] == "cancelled"
    assert (await (await client.get(f"/v2/tasks/{queued['id']}")).json())["status"] == "cancelled"
    result = await client.get(f"/v2/tasks/{queued['id']}/result")
    assert result.status == 409
    assert (await wait_for(client, running["id"]))["status"] == "succeeded"
    assert (await client.delete(f"/v2/tasks/{running['id']}")).status == 200  # finished: forgotten
    assert (await client.get(f"/v2/tasks/{running['id']}")).status == 404


async def test_failed_task_keeps_the_error_and_its_status(client: Any) -> None:
    body = json.loads(codec.encode_request(feeds()).body)
    body["parameters"] = {"async": True, "timeout": 1}  # 1 µs: the deadline passes before it can run
    first = await submit(client, seed=5)
    task = await (await client.post("/v2/models/slow/infer", data=json.dumps(body))).json()
    done = await wait_for(client, task["id"])
    assert done["status"] == "failed" and done["error_status"] == 504 and "deadline" in done["error"]
    result = await client.get(f"/v2/tasks/{task['id']}/result")
    assert result.status == 504 and "deadline" in (await result.json())["error"]
    await wait_for(client, (await first.json())["id"])


async def test_bad_request_is_refused_before_a_task_exists(client: Any) -> None:
    response = await client.post("/v2/models/slow/infer", headers={"Prefer": "respond-async"},
                                 data=json.dumps({"inputs": [{"name": "input", "datatype": "FP64",
                                                              "shape": [1, 64], "data": [0.0] * 64}]}))
    assert response.status == 400 and "expects datatype FP32" in (await response.json())["error"]


async def test_task_count_bound_refuses_when_all_pending_and_evicts_oldest_finished(aiohttp_client: Any,
                                                                                   make_app: Any) -> None:
    client = await aiohttp_client(make_app(max_tasks=2, retry_after_s=2))
    first = await (await submit(client, model="mlp", seed=0)).json()
    await wait_for(client, first["id"])
    a = await (await submit(client, seed=1)).json()
    b = await (await submit(client, seed=2)).json()  # evicts `first`, the oldest finished
    assert (await client.get(f"/v2/tasks/{first['id']}")).status == 404
    refused = await submit(client, seed=3)  # two pending: nothing may be evicted
    assert refused.status == 429 and refused.headers["Retry-After"] == "2"
    assert "pending" in (await refused.json())["error"]
    for task in (a, b):
        assert (await wait_for(client, task["id"]))["status"] == "succeeded"


async def test_byte_bound_and_ttl(aiohttp_client: Any, make_app: Any) -> None:
    client = await aiohttp_client(make_app(max_task_bytes=600, task_ttl_s=0.5))
    one = await (await submit(client, model="mlp", seed=0)).json()
    assert (await wait_for(client, one["id"]))["status"] == "succeeded"  # ~400 bytes of JSON
    two = await (await submit(client, model="mlp", seed=1)).json()
    assert (await wait_for(client, two["id"]))["status"] == "succeeded"
    assert (await client.get(f"/v2/tasks/{one['id']}")).status == 404  # evicted to stay under 600 bytes
    await asyncio.sleep(0.6)
    response = await client.get(f"/v2/tasks/{two['id']}")
    assert response.status == 404 and "expired" in (await response.json())["error"]


async def test_result_larger_than_the_byte_bound_fails_saying_so(aiohttp_client: Any, make_app: Any) -> None:
    client = await aiohttp_client(make_app(max_task_bytes=100))
    task = await (await submit(client, model="mlp", seed=0)).json()
    done = await wait_for(client, task["id"])
    assert done["status"] == "failed" and done["error_status"] == 507
    assert "more than max_task_bytes (100)" in done["error"]


async def test_shutdown_lets_pending_tasks_finish(aiohttp_client: Any, make_app: Any) -> None:
    from edge_runtime.server.state import STATE

    client = await aiohttp_client(make_app(drain_timeout_s=5.0))
    first = await (await submit(client, seed=0)).json()
    second = await (await submit(client, seed=1)).json()
    tasks = client.app[STATE].tasks
    await client.close()  # runs the app's cleanup: drain tasks, then the model queues
    assert tasks.get(first["id"]).status == "succeeded"
    assert tasks.get(second["id"]).status == "succeeded"
