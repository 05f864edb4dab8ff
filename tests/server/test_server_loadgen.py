"""``tools/loadgen.py`` against the real app: counts, bounds and errors by status."""

from __future__ import annotations

import time
from typing import Any

from loadgen import run_load


def base_url(client: Any) -> str:
    return str(client.make_url("")).rstrip("/")


async def test_closed_loop_stops_at_max_requests(client: Any) -> None:
    summary = await run_load(base_url(client), "mlp", concurrency=3, max_requests=20, duration_s=30, binary=True)
    assert (summary["requests"], summary["ok"], summary["errors"]) == (20, 20, {})
    latency = summary["latency_ms"]
    assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
    stats = (await (await client.get("/v2/models/mlp/versions/2/stats")).json())["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 20  # the server agrees with the generator


async def test_overload_shows_up_as_429_errors(client: Any) -> None:
    summary = await run_load(base_url(client), "slow", concurrency=4, duration_s=1.0)
    assert summary["ok"] >= 1
    assert summary["errors"].get("429", 0) >= 1
    assert summary["requests"] == summary["ok"] + sum(summary["errors"].values())


async def test_open_loop_keeps_its_rate_within_the_duration(client: Any) -> None:
    started = time.monotonic()
    summary = await run_load(base_url(client), "mlp", rate=40, duration_s=0.5, max_requests=1000)
    elapsed = time.monotonic() - started
    # 40/s for 0.5 s starts at most 21; a starved event loop may start fewer, never more
    assert 5 <= summary["requests"] <= 21
    assert summary["mode"] == "open" and summary["errors"] == {}
    assert elapsed < 10
    capped = await run_load(base_url(client), "mlp", rate=1000, duration_s=5, max_requests=7)
    assert capped["requests"] == 7
