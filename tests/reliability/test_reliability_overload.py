"""Overload is answered, not absorbed.

1. In process, with a gate (no timing): a plan held shut, a 2-slot queue and ten
   times more requests than worker plus queue can hold. Every request beyond
   that is rejected with 429 + Retry-After *while the plan is still shut* (so
   rejection never waited for compute), rejected requests never run, a request
   whose deadline passes in the queue gets 504 and never runs, the admitted
   ones all answer correctly once the gate opens, and the model serves normally
   afterwards.
2. A real daemon: its capacity measured first, then ~10x that offered open-loop
   for a bounded time against a 4-slot queue. It stays up, its memory stays
   bounded, the excess is rejected with 429 + Retry-After, every admitted request
   meets its deadline with the ONNX Runtime answer, and service is normal after.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import onnx
import pytest

from edge_runtime.protocol import codec
from reliability_fixtures import Daemon, gated_runs, mlp_feeds
from server_fixtures import ort_run

OVERLOAD_FACTOR = 10
WAIT_LIMIT_S = 60.0  # bounds for loops that wait on the server; never an assertion on speed


def _mlp_body(seed: int, **parameters: Any) -> bytes:
    return codec.encode_request(mlp_feeds(seed), parameters=parameters or None).body


async def _wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.01)


async def test_excess_is_rejected_before_any_compute_and_admitted_requests_answer(
        aiohttp_client: Any, make_rel_app: Any, gate: Any, rel_repo: Path) -> None:
    from edge_runtime.server.state import STATE

    app = make_rel_app(retry_after_s=2)
    client = await aiohttp_client(app)
    dispatcher = app[STATE].repository.get("gated").dispatcher
    config = app[STATE].repository.get("gated").config
    runs_before = gated_runs()
    capacity = 1 + config.queue.max_queue_size  # at least one running, the rest queued
    total = OVERLOAD_FACTOR * capacity
    # A deadline that passes in the queue: the first request holds the plan, the second expires behind it.
    tasks = [asyncio.ensure_future(client.post("/v2/models/gated/infer", data=_mlp_body(0, timeout=60_000_000)))]
    await _wait_until(lambda: gated_runs() > runs_before, "the first request running behind the gate")
    late = await client.post("/v2/models/gated/infer", data=_mlp_body(99, timeout=50_000))
    assert late.status == 504 and "deadline" in (await late.json())["error"]
    assert not gate.is_set() and gated_runs() - runs_before == 1
    tasks += [asyncio.ensure_future(client.post("/v2/models/gated/infer", data=_mlp_body(i, timeout=60_000_000)))
              for i in range(1, total)]

    def settled() -> bool:  # every request is answered, queued, or running behind the gate
        running = gated_runs() - runs_before
        return sum(t.done() for t in tasks) + dispatcher.pending + running >= total and running >= 1

    await _wait_until(settled, "all requests answered, queued or running")
    assert not gate.is_set()
    answered = [t.result() for t in tasks if t.done()]
    admitted = total - len(answered)
    assert answered and all(r.status == 429 for r in answered), sorted(r.status for r in answered)
    for response in answered:
        assert response.headers["Retry-After"] == "2"
        assert "queue" in (await response.json())["error"]
    assert 1 <= admitted <= capacity + 2, admitted  # + the worker slots beyond one, at most

    gate.set()
    results = await asyncio.gather(*tasks)
    ok = [r for r in results if r.status == 200]
    assert len(ok) == admitted and len(ok) + len(answered) == total, sorted(r.status for r in results)
    expected = {i: ort_run(rel_repo / "gated" / "1" / "model.onnx", mlp_feeds(i)) for i in range(total)}
    for i, task in enumerate(tasks):
        response = task.result()
        if response.status == 200:
            (output,) = (await response.json())["outputs"]
            np.testing.assert_allclose(np.array(output["data"], np.float32).reshape(output["shape"]),
                                       next(iter(expected[i].values())), rtol=1e-5, atol=1e-6)
    ran = gated_runs() - runs_before
    assert ran == admitted, (ran, admitted)  # neither the rejected nor the expired one ever ran

    # Back to normal: one request at a time is served at once.
    for seed in range(3):
        response = await client.post("/v2/models/gated/infer", data=_mlp_body(seed))
        assert response.status == 200
    assert dispatcher.pending == 0


HEAVY_CONFIG = '[queue]\nmax_queue_size = 4\n[serving]\nbackend = "cpu"\n'
PROBE_REQUESTS = 12
OVERLOAD_S = 3.0
DEADLINE_US = 20_000_000  # generous: the property is "answered or refused", not a latency figure
MAX_IN_FLIGHT = 64
RSS_GROWTH_LIMIT = 256 * 1024 * 1024


@pytest.fixture(scope="module")
def heavy_daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from cloud_fixtures import build_heavy

    root = tmp_path_factory.mktemp("overload")
    model_dir = root / "repository" / "heavy" / "1"
    model_dir.mkdir(parents=True)
    onnx.save(build_heavy(), str(model_dir / "model.onnx"))
    (root / "repository" / "heavy" / "config.toml").write_text(HEAVY_CONFIG)
    daemon = Daemon.start(root / "repository", root / "cache", root / "serve.log")
    yield daemon, model_dir / "model.onnx"
    assert daemon.stop() == 0, daemon.log()[-3000:]


async def test_ten_times_capacity_is_refused_fast_and_the_daemon_recovers(heavy_daemon: Any) -> None:
    daemon, model_path = heavy_daemon
    inputs = [np.random.default_rng(i).standard_normal((1, 64, 256)).astype(np.float32) for i in range(4)]
    expected = [ort_run(model_path, {"x": x})["y"] for x in inputs]
    bodies = [codec.encode_request({"x": x}, binary=True, parameters={"timeout": DEADLINE_US}) for x in inputs]
    url = f"{daemon.url}/v2/models/heavy/infer"
    outcomes: list[tuple[int, float, bool]] = []  # status, seconds, Retry-After present

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=MAX_IN_FLIGHT),
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:
        async def one(i: int, record: bool = True) -> int:
            encoded = bodies[i % len(bodies)]
            started = time.perf_counter()
            async with session.post(url, data=encoded.body, headers={
                    "Inference-Header-Content-Length": str(encoded.header_length)}) as response:
                if response.status == 200:
                    (output,) = (await response.json())["outputs"]
                    np.testing.assert_allclose(np.array(output["data"], np.float32).reshape(output["shape"]),
                                               expected[i % len(bodies)], rtol=1e-4, atol=1e-5)
                else:
                    await response.read()
                if record:
                    outcomes.append((response.status, time.perf_counter() - started,
                                     "Retry-After" in response.headers))
                return response.status

        # Capacity, measured: requests one at a time.
        started = time.perf_counter()
        for i in range(PROBE_REQUESTS):
            assert await one(i, record=False) == 200
        capacity_rps = PROBE_REQUESTS / (time.perf_counter() - started)
        rss_before = daemon.rss_bytes()

        # Overload: OVERLOAD_FACTOR x capacity, open loop, bounded in time and in flight.
        rate = OVERLOAD_FACTOR * capacity_rps
        running: set[asyncio.Task] = set()
        rss_peak, sent, next_at = rss_before, 0, time.monotonic()
        stop_at = next_at + OVERLOAD_S
        while time.monotonic() < stop_at and sent < int(rate * OVERLOAD_S) + 1:
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            next_at += 1.0 / rate
            if len(running) < MAX_IN_FLIGHT:
                task = asyncio.ensure_future(one(sent))
                running.add(task)
                task.add_done_callback(running.discard)
                sent += 1
            if sent % 50 == 0:
                rss_peak = max(rss_peak, daemon.rss_bytes())
        await asyncio.gather(*running)
        rss_peak = max(rss_peak, daemon.rss_bytes())
        assert daemon.process.poll() is None, daemon.log()[-3000:]

        statuses = [s for s, _, _ in outcomes]
        assert set(statuses) <= {200, 429}, {s: statuses.count(s) for s in set(statuses)}
        assert statuses.count(429) > 0 and statuses.count(200) > 0, statuses.count(200)
        assert all(retry for s, _, retry in outcomes if s == 429)
        assert rss_peak - rss_before < RSS_GROWTH_LIMIT, (rss_before, rss_peak)

        # Service is normal again: nothing left queued, requests one at a time all answered.
        for i in range(PROBE_REQUESTS // 2):
            assert await one(i, record=False) == 200
        async with session.get(f"{daemon.url}/v2/health/ready") as response:
            assert response.status == 200
    rejected = sorted(t for s, t, _ in outcomes if s == 429)
    admitted = sorted(t for s, t, _ in outcomes if s == 200)
    print(f"overload: capacity {capacity_rps:.1f} rps, offered {rate:.0f} rps for {OVERLOAD_S} s: "
          f"{len(admitted)} answered (p50 {1e3 * admitted[len(admitted) // 2]:.0f} ms), {len(rejected)} rejected "
          f"(p50 {1e3 * rejected[len(rejected) // 2]:.1f} ms), RSS +{(rss_peak - rss_before) / 2**20:.1f} MiB")
