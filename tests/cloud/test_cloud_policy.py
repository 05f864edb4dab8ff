"""The pure parts: circuit breaker states, the fallback decision table, configuration, the estimators."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_consecutive_failures_and_probes_once_before_closing() -> None:
    from edge_runtime.cloud.breaker import CircuitBreaker

    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=3, reset_ms=1000, clock=clock)
    for _ in range(2):
        assert breaker.allow()
        breaker.record_failure()
    breaker.record_success()  # a success in between resets the count
    for _ in range(3):
        assert breaker.allow()
        breaker.record_failure()
    assert breaker.state == "open" and not breaker.allow()
    clock.now += 0.999
    assert not breaker.allow()
    clock.now += 0.002
    assert breaker.state == "half_open"
    assert breaker.allow() and not breaker.allow()  # one probe at a time
    breaker.record_failure()  # the probe failed: open again for a full period
    assert breaker.state == "open"
    clock.now += 1.0
    assert breaker.allow()
    breaker.record_success()
    snapshot = breaker.snapshot()
    assert snapshot.state == "closed" and snapshot.opened == 2 and snapshot.closed_again == 1
    assert snapshot.rejected == 3


def _policy(mode: str, target_ms: float = 0.0, open_breaker: bool = False):
    from edge_runtime.cloud.breaker import CircuitBreaker
    from edge_runtime.cloud.config import CloudModelConfig
    from edge_runtime.cloud.fallback import FallbackPolicy

    breaker = CircuitBreaker(failure_threshold=1, reset_ms=60_000)
    if open_breaker:
        breaker.record_failure()
    return FallbackPolicy(CloudModelConfig(mode=mode, remote_model="m", latency_target_ms=target_ms), breaker)


@pytest.mark.parametrize("mode, local_available, estimate_ms, open_breaker, target", [
    ("never", False, 500.0, False, "local"),
    ("fallback", True, None, False, "local"),
    ("fallback", True, 40.0, False, "local"),
    ("fallback", True, 60.0, False, "cloud"),
    ("fallback", True, 60.0, True, "local"),
    ("fallback", False, None, True, "cloud"),  # nothing local can run it: only the cloud can try
    ("always", True, None, False, "cloud"),
    ("always", True, None, True, "local"),
    ("split", True, 1.0, False, "cloud"),
])
def test_fallback_decision_table(mode: str, local_available: bool, estimate_ms: float | None,
                                 open_breaker: bool, target: str) -> None:
    policy = _policy(mode, target_ms=50.0, open_breaker=open_breaker)
    route = policy.route(local_available=local_available, local_estimate_ms=estimate_ms)
    assert route.target == target, route.reason


def test_local_queue_full_or_backend_failure_goes_to_the_cloud_unless_never() -> None:
    from edge_runtime.errors import BackendError, InvalidInputError, QueueFullError

    policy = _policy("fallback")
    assert policy.after_local_failure(QueueFullError("full")).target == "cloud"
    assert "backend failed" in policy.after_local_failure(BackendError("lost device")).reason
    assert policy.after_local_failure(InvalidInputError("bad")) is None  # the caller's mistake stays theirs
    assert _policy("never").after_local_failure(QueueFullError("full")) is None
    assert _policy("fallback", open_breaker=True).after_local_failure(QueueFullError("full")) is None


def test_router_sends_queue_overflow_to_the_cloud_and_reports_it() -> None:
    from edge_runtime.cloud.fallback import CloudRouter
    from edge_runtime.errors import QueueFullError

    class Call:
        outputs = {"y": np.ones(2, np.float32)}
        retried, attempts = False, 1

    class Plan:
        def call(self, feeds, request_id=None):
            return Call()

    async def full(feeds):
        raise QueueFullError("model 'm': queue full (1 waiting)")

    router = CloudRouter(_policy("fallback"), local=full, cloud=Plan())
    result = asyncio.run(router.infer({"x": np.zeros(2, np.float32)}))
    assert result.ran_on == "cloud" and "queue full" in result.fallback and "queue full" in result.reason
    router = CloudRouter(_policy("never"), local=full, cloud=Plan())
    with pytest.raises(QueueFullError):
        asyncio.run(router.infer({"x": np.zeros(2, np.float32)}))


def test_configuration_spellings(tmp_path: Path) -> None:
    from edge_runtime.cloud.config import cloud_config, model_cloud_config
    from edge_runtime.errors import ConfigError
    from edge_runtime.scheduler.config import model_config

    config = cloud_config({"url": "https://cloud.example:8443/", "token_env": "MY_TOKEN", "timeout_ms": 1500},
                          env={"MY_TOKEN": "s3cret"})
    assert config.token == "s3cret" and config.timeout_ms == 1500 and config.is_tls
    assert config.base_url == "https://cloud.example:8443"
    assert cloud_config({"url": "http://127.0.0.1:1"}, env={}).token is None
    with pytest.raises(ConfigError, match="token_env"):
        cloud_config({"url": "http://h", "token": "inline"}, env={})
    with pytest.raises(ConfigError, match="unknown key"):
        cloud_config({"url": "http://h", "timeout": 3}, env={})
    with pytest.raises(ConfigError, match="ca_file"):
        cloud_config({"url": "https://h", "ca_file": str(tmp_path / "missing.pem")}, env={})
    with pytest.raises(ConfigError, match="url"):
        cloud_config({"url": "ftp://h"}, env={})
    document = {"cloud": {"mode": "split", "remote_model": "tail", "split_at": "pool1"}}
    per_model = model_cloud_config(model_config(document).extra)
    assert (per_model.mode, per_model.remote_model, per_model.split_at) == ("split", "tail", "pool1")
    assert model_cloud_config({}).mode == "never"
    with pytest.raises(ConfigError, match="mode"):
        model_cloud_config({"cloud": {"mode": "sometimes", "remote_model": "m"}})
    with pytest.raises(ConfigError, match="remote_model"):
        model_cloud_config({"cloud": {"mode": "always"}})


def test_network_estimator_recovers_the_link_that_generated_the_samples() -> None:
    from edge_runtime.cloud.network import NetworkEstimator

    rng = np.random.default_rng(0)
    estimator = NetworkEstimator(rtt_ms=5.0, bandwidth_bps=100e6)
    true_rtt_ms, true_bps = 60.0, 1.5e6
    for _ in range(30):
        estimator.observe_rtt(true_rtt_ms * rng.uniform(0.9, 1.1))
        nbytes = int(rng.integers(50_000, 400_000))
        server_ms = float(rng.uniform(1, 10))
        estimator.observe_call(true_rtt_ms + nbytes / true_bps * 1e3 + server_ms, nbytes, server_ms)
    snapshot = estimator.snapshot()
    assert snapshot.rtt_ms == pytest.approx(true_rtt_ms, rel=0.15)
    assert snapshot.bandwidth_bps == pytest.approx(true_bps, rel=0.2)
    assert snapshot.call_ms(150_000) == pytest.approx(true_rtt_ms + 100.0, rel=0.15)


def test_cut_choice_follows_the_network() -> None:
    from edge_runtime.cloud.choice import CutCost, SplitProfile
    from edge_runtime.cloud.network import NetworkSnapshot
    from edge_runtime.cloud.split import Cut

    def cut(index: int, nbytes: int) -> Cut:
        return Cut(index, (f"t{index}",), (), ("x",), (f"t{index}",), ("y",), nbytes, f"n{index}")

    # 100 ms locally; an early cut moves 200 kB, a late one 2 kB after 90 ms of work.
    profile = SplitProfile(100.0, 300_000, 40, (CutCost(cut(1, 200_000), 2.0, 40), CutCost(cut(9, 2_000), 90.0, 40)))
    fast, slow = NetworkSnapshot(5.0, 50e6, 1, 1), NetworkSnapshot(100.0, 0.1e6, 1, 1)
    assert profile.best(fast, 10.0).plan == "split@1"
    assert profile.best(slow, 10.0).plan == "local"
    assert profile.best(slow, 10.0, splits_only=True).plan == "split@9"
    estimate = profile.estimate("split@1", fast, 10.0)
    assert estimate.estimated_ms == pytest.approx(2.0 + 5.0 + 200_040 / 50e6 * 1e3 + 98.0 / 10.0)
