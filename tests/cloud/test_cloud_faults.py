"""Faults of the cloud peer are answered locally: down, slow, 5xx, reset mid-body; the breaker opens
and later closes; under a bounded load with random resets no request is lost or silently run twice."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cloud_fixtures import ServerProcess, build_cnn, cnn_feeds, free_port, ort_outputs
from netem_proxy import LinkProfile, ShapingProxy


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import onnx

    path = tmp_path_factory.mktemp("local") / "cnn.onnx"
    onnx.save(build_cnn(), str(path))
    return path


@pytest.fixture(scope="module")
def local_model(runtime, cnn_path: Path) -> Any:
    model = runtime.load(cnn_path, backend="cpu")
    yield model
    model.close()


@pytest.fixture(scope="module")
def expected() -> dict[int, np.ndarray]:
    return {seed: ort_outputs(build_cnn(), cnn_feeds(seed))["probabilities"] for seed in range(8)}


def _router(config: Any, local_model: Any, remote_model: str = "cnn", mode: str = "always") -> Any:
    from edge_runtime.cloud.client import CloudClient
    from edge_runtime.cloud.config import CloudModelConfig
    from edge_runtime.cloud.fallback import CloudRouter, FallbackPolicy
    from edge_runtime.cloud.plans import CloudPlan

    client = CloudClient(config)
    plan = CloudPlan(client, remote_model, local_ms=5.0, io_bytes=12_328)
    policy = FallbackPolicy(CloudModelConfig(mode=mode, remote_model=remote_model), client.breaker)
    return CloudRouter(policy, local=local_model.run_async, cloud=plan), client


def _check(result: Any, expected: dict[int, np.ndarray], seed: int) -> None:
    np.testing.assert_allclose(result.outputs["probabilities"], expected[seed], rtol=1e-5, atol=1e-7)


async def test_cloud_down_answers_locally_then_breaker_opens_and_later_closes(
        cloud_repo: Path, cloud_config: Any, local_model: Any, expected: dict, tmp_path: Path) -> None:
    port = free_port()
    config = dataclasses.replace(cloud_config, url=f"http://127.0.0.1:{port}", retries=1, breaker_reset_ms=500)
    router, client = _router(config, local_model)
    try:
        for seed in range(3):  # three failures in a row: the breaker opens
            result = await router.infer(cnn_feeds(seed))
            _check(result, expected, seed)
            assert result.ran_on == "local" and "could not connect" in result.fallback
            assert result.retried and result.cloud_attempts == 2 and not result.ran_twice
        assert client.breaker.state == "open"
        result = await router.infer(cnn_feeds(3))
        _check(result, expected, 3)
        assert result.ran_on == "local" and result.fallback is None and "breaker is open" in result.reason
        server = ServerProcess.start(cloud_repo, tmp_path / "late.log", port=port)
        try:
            await asyncio.sleep(0.5)
            assert client.breaker.state == "half_open"  # past breaker_reset_ms: the next request is the probe
            result = await router.infer(cnn_feeds(4))
            _check(result, expected, 4)
            assert result.ran_on == "cloud" and result.fallback is None
            assert client.breaker.state == "closed"
            assert client.breaker.snapshot().closed_again == 1
        finally:
            server.stop()
    finally:
        client.close()


async def test_slow_cloud_beyond_timeout_runs_locally_and_says_it_may_have_run_twice(
        cloud_server: Any, cloud_config: Any, local_model: Any, expected: dict) -> None:
    with ShapingProxy("127.0.0.1", cloud_server.port, LinkProfile("slow", delay_ms=300)) as proxy:
        config = dataclasses.replace(cloud_config, url=f"http://127.0.0.1:{proxy.port}", timeout_ms=250)
        router, client = _router(config, local_model)
        try:
            result = await router.infer(cnn_feeds(1))
        finally:
            client.close()
    _check(result, expected, 1)
    assert result.ran_on == "local" and "may have run it" in result.fallback
    assert result.ran_twice and not result.retried and result.cloud_attempts == 1


async def test_cloud_5xx_runs_locally_and_opens_the_breaker(cloud_config: Any, local_model: Any,
                                                            expected: dict) -> None:
    router, client = _router(cloud_config, local_model, remote_model="faulty")
    try:
        results = [await router.infer(cnn_feeds(seed)) for seed in range(4)]
    finally:
        client.close()
    for seed, result in enumerate(results):
        _check(result, expected, seed)
        assert result.ran_on == "local" and not result.ran_twice
    assert all("HTTP 503" in r.fallback for r in results[:3])
    assert "breaker is open" in results[3].reason and client.breaker.state == "open"


async def test_connection_reset_mid_body_runs_locally(cloud_server: Any, cloud_config: Any, local_model: Any,
                                                     expected: dict) -> None:
    with ShapingProxy("127.0.0.1", cloud_server.port, LinkProfile("reset", reset_after_bytes=64)) as proxy:
        router, client = _router(dataclasses.replace(cloud_config, url=f"http://127.0.0.1:{proxy.port}"),
                                 local_model)
        try:
            result = await router.infer(cnn_feeds(2))
        finally:
            client.close()
        assert proxy.resets == 1
    _check(result, expected, 2)
    assert result.ran_on == "local" and result.ran_twice and "connection lost" in result.fallback


async def test_bounded_load_with_random_resets_loses_nothing(cloud_server: Any, cloud_config: Any,
                                                             local_model: Any, expected: dict) -> None:
    profile = LinkProfile("flaky", delay_ms=2, reset_after_bytes=64, reset_probability=0.5)
    with ShapingProxy("127.0.0.1", cloud_server.port, profile, seed=7) as proxy:
        config = dataclasses.replace(cloud_config, url=f"http://127.0.0.1:{proxy.port}", breaker_failures=1000)
        router, client = _router(config, local_model)
        try:
            seeds = [i % 8 for i in range(24)]
            results = await asyncio.wait_for(asyncio.gather(*(router.infer(cnn_feeds(s)) for s in seeds)), 60)
        finally:
            client.close()
        resets = proxy.resets
    for seed, result in zip(seeds, results):
        _check(result, expected, seed)
    local = [r for r in results if r.ran_on == "local"]
    assert len(results) == 24 and 0 < len(local) < 24
    assert all(r.ran_twice for r in local)  # each local answer after a reset says the cloud may have run it too
    assert len(local) == resets


def test_scheduler_reruns_a_failed_cloud_plan_on_cpu(cloud_config: Any, local_model: Any, expected: dict) -> None:
    from edge_runtime.cloud.client import CloudClient
    from edge_runtime.cloud.plans import CloudPlan
    from edge_runtime.scheduler import CallablePlan, ModelConfig, ModelScheduler, SchedulerConfig

    client = CloudClient(dataclasses.replace(cloud_config, url=f"http://127.0.0.1:{free_port()}", retries=0))
    plans = {"cpu": CallablePlan("cpu", ("cpu",), local_model.run),
             "cloud": CloudPlan(client, "cnn", local_ms=5.0, io_bytes=12_328)}
    config = ModelConfig(scheduler=SchedulerConfig(policy="fixed", plan="cloud"))

    async def one() -> Any:
        async with ModelScheduler("cnn", local_model.inputs, plans, config) as scheduler:
            return await scheduler.infer(cnn_feeds(5))

    try:
        result = asyncio.run(one())
    finally:
        client.close()
    np.testing.assert_allclose(result.outputs["probabilities"], expected[5], rtol=1e-5, atol=1e-7)
    assert result.plan == "cpu" and "plan 'cloud' failed" in result.fallback and "could not connect" in result.fallback
