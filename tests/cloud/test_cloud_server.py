"""Edge-cloud through the server: B (the real app, in process) answers through A (``python -m edge_runtime serve``).

B is configured as an operator would: a server config file with a ``[cloud]``
table, and per-model ``config.toml`` files with ``[cloud]`` sections. Every
answer is checked against plain ONNX Runtime on the same model, and where it
ran is checked three ways: B's response parameters, B's ``/metrics``, and A's
own request counters.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import aiohttp
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cloud_fixtures import TOKEN, ServerProcess, build_cnn, build_det, cnn_feeds, ort_outputs, write_model
from edge_runtime.protocol import codec

SLOW_LOCAL_S = 0.5  # the "fallback" model's local plan: long enough for its 1-slot queue to overflow
CNN_CLOUD = '[serving]\nbackend = "cpu"\n[cloud]\nmode = "{mode}"\nremote_model = "cnn"\n'
# No OpenCL kernel takes Det: with the OpenCL backend asked for, this device cannot load the model at all.
DET_GPU_ONLY = '[serving]\nbackend = "opencl"\n[cloud]\nmode = "fallback"\nremote_model = "det"\n'


class SlowPlan:
    """The model's own cpu plan, taking at least ``SLOW_LOCAL_S`` per run (a busy device)."""

    def __init__(self, inner: Any) -> None:
        self.name, self.backends, self.inner = inner.name, inner.backends, inner

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(SLOW_LOCAL_S)
        return self.inner.run(feeds)


def slow_fallback_model(model: Any) -> dict[str, Any]:
    from edge_runtime.scheduler import model_plans

    return {name: SlowPlan(plan) for name, plan in model_plans(model).items()} if model.name == "fallback" else {}


async def start_b(aiohttp_client: Any, runtime: Any, root: Path, cloud_table: str, env: Mapping[str, str],
                  extra_plans: Callable[[Any], Any] | None = None) -> Any:
    from edge_runtime.server.app import create_app
    from edge_runtime.server.config import load_settings
    from edge_runtime.serving.repository import ModelRepository

    config = root.parent / "b-server.toml"
    config.write_text(f"[server]\nport = 0\n[cloud]\n{cloud_table}")
    settings = load_settings(config, {}, env=env)
    repository = ModelRepository(root, runtime, load=settings.load, cloud=settings.cloud, extra_plans=extra_plans,
                                 drain_timeout_s=5.0)
    return await aiohttp_client(create_app(settings.server, repository))


def write_config(root: Path, name: str, text: str) -> None:
    (root / name / "config.toml").write_text(text)


async def infer(client: Any, model: str, feeds: Mapping[str, np.ndarray]) -> tuple[int, dict[str, Any]]:
    response = await client.post(f"/v2/models/{model}/infer", data=codec.encode_request(dict(feeds)).body)
    return response.status, await response.json()


def outputs_of(body: dict[str, Any]) -> dict[str, np.ndarray]:
    return {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in body["outputs"]}


def assert_oracle(body: dict[str, Any], model: Any, feeds: Mapping[str, np.ndarray]) -> None:
    expected = ort_outputs(model, feeds)
    got = outputs_of(body)
    assert set(got) == set(expected)
    for name, array in expected.items():
        np.testing.assert_allclose(got[name], array, rtol=1e-4, atol=1e-5)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def b_metrics(client: Any) -> Callable[..., float | None]:
    found = samples(await (await client.get("/metrics")).text())
    return lambda name, **labels: found.get((name, tuple(sorted(labels.items()))))


async def peer_successes(peer: ServerProcess, model: str) -> float:
    """A's own count of requests it answered for ``model`` (its /metrics needs the token)."""
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session:
        async with session.get(f"{peer.url}/metrics") as response:
            found = samples(await response.text())
    return found[("nv_inference_request_success", (("model", model), ("version", "1")))]


def det_feeds(seed: int = 0) -> dict[str, np.ndarray]:
    return {"m": np.random.default_rng(seed).standard_normal((4, 3, 3)).astype(np.float32)}


async def test_peer_answers_always_mode_queue_overflow_and_a_model_this_device_cannot_load(
        aiohttp_client: Any, runtime: Any, cloud_server: ServerProcess, tmp_path: Path) -> None:
    root = tmp_path / "repository"
    for name, mode in (("always", "always"), ("fallback", "fallback")):
        write_model(root, name, build_cnn())
        write_config(root, name, CNN_CLOUD.format(mode=mode))
    (root / "fallback" / "config.toml").write_text(CNN_CLOUD.format(mode="fallback") + "[queue]\nmax_queue_size = 1\n")
    write_model(root, "det", build_det())
    write_config(root, "det", DET_GPU_ONLY)
    client = await start_b(aiohttp_client, runtime, root,
                           f'url = "{cloud_server.url}"\ntoken_env = "B_CLOUD_TOKEN"\nretry_backoff_ms = 10\n',
                           env={"B_CLOUD_TOKEN": TOKEN}, extra_plans=slow_fallback_model)
    answered_by_a = await peer_successes(cloud_server, "cnn")

    for seed in (0, 1):  # mode "always": A answers
        status, body = await infer(client, "always", cnn_feeds(seed))
        assert status == 200, body
        parameters = body["parameters"]
        assert (parameters["ran_on"], parameters["plan"], parameters["backends"]) == ("cloud", "cloud", "cloud")
        assert parameters["route"] == "cloud mode is 'always'" and "fallback" not in parameters
        assert_oracle(body, build_cnn(), cnn_feeds(seed))

    # mode "fallback": one request runs, one waits in the 1-slot queue, the third overflows to A
    answers = await asyncio.gather(*(infer(client, "fallback", cnn_feeds(seed)) for seed in range(3)))
    assert [status for status, _ in answers] == [200, 200, 200], answers
    by_place = sorted((body["parameters"]["ran_on"], seed) for seed, (_, body) in enumerate(answers))
    assert [place for place, _ in by_place] == ["cloud", "local", "local"]
    overflowed = answers[by_place[0][1]][1]["parameters"]
    assert "queue full" in overflowed["fallback"] and overflowed["plan"] == "cloud"
    for seed, (_, body) in enumerate(answers):
        assert_oracle(body, build_cnn(), cnn_feeds(seed))

    # a model this device cannot load (no OpenCL kernel for Det) is served by A alone
    metadata = await (await client.get("/v2/models/det")).json()
    assert metadata["edge_runtime"]["backend"] == "cloud" and metadata["inputs"][0]["shape"] == [4, 3, 3]
    status, body = await infer(client, "det", det_feeds())
    assert status == 200 and body["parameters"]["ran_on"] == "cloud", body
    assert_oracle(body, build_det(), det_feeds())

    assert await peer_successes(cloud_server, "cnn") - answered_by_a == 3  # A really ran them
    metric = await b_metrics(client)
    assert metric("edge_runtime_cloud_calls_total", model="always", outcome="ok") == 2
    assert metric("edge_runtime_cloud_calls_total", model="fallback", outcome="ok") == 1
    assert metric("edge_runtime_cloud_calls_total", model="det", outcome="ok") == 1
    assert metric("edge_runtime_plan_total", model="fallback", version="1", plan="cpu") == 2
    assert metric("edge_runtime_plan_total", model="fallback", version="1", plan="cloud") == 1
    assert metric("edge_runtime_cloud_breaker_state", state="closed") == 1


async def test_with_the_peer_down_b_answers_locally_and_the_breaker_opens(aiohttp_client: Any, runtime: Any,
                                                                        tmp_path: Path) -> None:
    peer_root = tmp_path / "peer"
    write_model(peer_root, "cnn", build_cnn())
    write_model(peer_root, "det", build_det())
    peer = ServerProcess.start(peer_root, tmp_path / "peer.log")
    try:
        root = tmp_path / "repository"
        write_model(root, "always", build_cnn())
        write_config(root, "always", CNN_CLOUD.format(mode="always"))
        write_model(root, "det", build_det())
        write_config(root, "det", DET_GPU_ONLY)
        client = await start_b(aiohttp_client, runtime, root,
                               f'url = "{peer.url}"\nretries = 1\nretry_backoff_ms = 10\nbreaker_failures = 2\n'
                               "breaker_reset_ms = 60000\n", env={})
        status, body = await infer(client, "always", cnn_feeds(0))
        assert status == 200 and body["parameters"]["ran_on"] == "cloud", body
        peer.stop()

        for seed in (1, 2):  # A is down: B answers locally, saying why
            status, body = await infer(client, "always", cnn_feeds(seed))
            assert status == 200, body
            parameters = body["parameters"]
            assert (parameters["ran_on"], parameters["plan"]) == ("local", "cpu")
            assert "could not connect" in parameters["fallback"]
            assert parameters["retried"] is True and parameters["ran_twice"] is False  # refused: never sent
            assert_oracle(body, build_cnn(), cnn_feeds(seed))
        metric = await b_metrics(client)
        assert metric("edge_runtime_cloud_breaker_state", state="open") == 1
        assert metric("edge_runtime_cloud_breaker_opened_total") == 1
        assert metric("edge_runtime_cloud_calls_total", model="always", outcome="ok") == 1
        assert metric("edge_runtime_cloud_calls_total", model="always", outcome="refused") == 2

        status, body = await infer(client, "always", cnn_feeds(3))  # breaker open: local without trying A
        assert status == 200 and body["parameters"]["route"] == "cloud circuit breaker is open", body
        assert "fallback" not in body["parameters"]
        assert_oracle(body, build_cnn(), cnn_feeds(3))

        status, body = await infer(client, "det", det_feeds())  # nothing here can run it: 502
        assert status == 502 and "circuit breaker open" in body["error"], body
        metric = await b_metrics(client)
        assert metric("edge_runtime_cloud_calls_total", model="always", outcome="refused") == 2
        assert metric("edge_runtime_cloud_calls_total", model="det", outcome="breaker_open") == 1
        assert metric("edge_runtime_cloud_breaker_rejected_total") == 1
        assert metric("nv_inference_request_failure", model="det", version="1", reason="BACKEND") == 1
    finally:
        peer.stop()


@pytest.mark.parametrize("table, message", [
    ('[cloud]\nmode = "sometimes"\nremote_model = "cnn"\n', "[cloud] mode must be one of"),
    ('[cloud]\nmode = "always"\n', "needs remote_model"),
])
async def test_a_bad_cloud_section_fails_the_load_naming_it(aiohttp_client: Any, runtime: Any, tmp_path: Path,
                                                          table: str, message: str) -> None:
    root = tmp_path / "repository"
    write_model(root, "cnn", build_cnn())
    write_config(root, "cnn", table)
    client = await start_b(aiohttp_client, runtime, root, 'url = "http://127.0.0.1:9"\n', env={})
    entries = await (await client.post("/v2/repository/index")).json()
    assert [(e["name"], e["state"]) for e in entries] == [("cnn", "UNAVAILABLE")]
    assert message in entries[0]["reason"]
