"""Overload, deadlines and priorities on the ``slow`` model (a 0.3 s plan, a 1-slot queue)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np
import pytest

from edge_runtime.protocol import codec
from server_fixtures import SLOW_PLAN_S


def slow_body(seed: int = 0, **parameters: Any) -> bytes:
    feeds = {"input": np.random.default_rng(seed).standard_normal((1, 64)).astype(np.float32)}
    return codec.encode_request(feeds, parameters=parameters or None).body


@pytest.mark.parametrize("overload_status", [429, 503])
async def test_queue_full_is_rejected_at_once_with_retry_after(aiohttp_client: Any, make_app: Any,
                                                               overload_status: int) -> None:
    client = await aiohttp_client(make_app(overload_status=overload_status, retry_after_s=3))
    started = time.monotonic()
    responses = await asyncio.gather(*(client.post("/v2/models/slow/infer", data=slow_body(i)) for i in range(6)))
    statuses = sorted(r.status for r in responses)
    # at most one runs and one waits in the 1-slot queue; the rest are turned away without waiting
    assert 1 <= statuses.count(200) <= 2 and statuses.count(overload_status) >= 4, statuses
    assert set(statuses) == {200, overload_status}
    for response in responses:
        if response.status == overload_status:
            assert response.headers["Retry-After"] == "3"
            assert "queue full" in (await response.json())["error"]
    assert time.monotonic() - started < 6 * SLOW_PLAN_S + 5  # the rejected ones never ran


async def test_deadline_exceeded_is_504_and_counted_as_timeout(client: Any) -> None:
    first = asyncio.ensure_future(client.post("/v2/models/slow/infer", data=slow_body(0)))
    await asyncio.sleep(0.05)  # let it occupy the plan
    started = time.monotonic()
    response = await client.post("/v2/models/slow/infer", data=slow_body(1, timeout=50_000))  # 50 ms in µs
    waited_s = time.monotonic() - started
    assert response.status == 504
    assert "deadline" in (await response.json())["error"]
    assert 0.03 < waited_s < SLOW_PLAN_S + 2.0
    assert (await first).status == 200
    stats = (await (await client.get("/v2/models/slow/stats")).json())["model_stats"][0]
    assert stats["inference_stats"]["fail"]["count"] == 1
    metrics = await (await client.get("/metrics")).text()
    assert 'nv_inference_request_failure{model="slow",reason="TIMEOUT",version="1"} 1.0' in metrics


async def test_priority_one_overtakes_the_default_level(aiohttp_client: Any, make_app: Any, repo_copy: Any) -> None:
    (repo_copy / "slow" / "config.toml").write_text("[queue]\nmax_queue_size = 8\n[serving]\nbackend = \"cpu\"\n")
    client = await aiohttp_client(make_app(repo_copy))
    finished: list[str] = []

    async def send(tag: str, **parameters: Any) -> None:
        response = await client.post("/v2/models/slow/infer",
                                     data=json.dumps({**json.loads(slow_body()), "id": tag,
                                                      "parameters": parameters}))
        assert response.status == 200
        finished.append((await response.json())["id"])

    first = asyncio.ensure_future(send("first"))
    await asyncio.sleep(0.05)
    later = [asyncio.ensure_future(send("background", priority=9)),
             asyncio.ensure_future(send("default")),
             asyncio.ensure_future(send("urgent", priority=1))]
    await asyncio.gather(first, *later)
    assert finished == ["first", "urgent", "default", "background"]
