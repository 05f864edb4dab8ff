"""The server's LoadMonitor reaches the scheduling policy: ``[load] pin_gpu_busy`` decides the plan.

The repository's mlp has ``[scheduler] policy = "threshold"``, so the scheduler
factory gives it a cpu plan (ONNX Runtime) and a gpu plan (the OpenCL backend;
PoCL in tests and CI). The server config file pins the GPU busy share; the rule
"GPU while busy < 0.7, else cpu" must pick the plan the response and
``edge_runtime_plan_total`` report. ONNX Runtime on the same file is the oracle.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.load_monitor import LoadConfig
from edge_runtime.protocol import codec
from edge_runtime.server.config import load_settings
from server_fixtures import ort_run
from test_server_metrics import sampled_metrics, value

REQUESTS = 3


@pytest.mark.requires_opencl
@pytest.mark.parametrize("gpu_busy, plan, backends", [(0.95, "cpu", "cpu"), (0.1, "gpu", "opencl")])
async def test_pinned_gpu_busy_picks_the_threshold_policys_plan(aiohttp_client: Any, make_app: Any, repo_copy: Path,
                                                                tmp_path: Path, gpu_busy: float, plan: str,
                                                                backends: str) -> None:
    (repo_copy / "mlp" / "config.toml").write_text(
        '[scheduler]\npolicy = "threshold"\ngpu_busy_threshold = 0.7\n[serving]\nbackend = "cpu"\n')  # serves v2
    server_toml = tmp_path / "server.toml"
    server_toml.write_text(f"[server]\nport = 0\n[load]\nsample_interval_ms = 50\npin_gpu_busy = {gpu_busy}\n")
    settings = load_settings(server_toml, {}, env={})
    assert settings.load.pin_gpu_busy == gpu_busy and settings.cloud is None
    client = await aiohttp_client(make_app(repo_copy, load=settings.load))
    metadata = await (await client.get("/v2/models/mlp/versions/2")).json()
    assert {"cpu", "gpu"} <= set(metadata["edge_runtime"]["plans"])
    for seed in range(REQUESTS):
        feeds = {"input": np.random.default_rng(seed).standard_normal((2, 64)).astype(np.float32)}
        response = await client.post("/v2/models/mlp/versions/2/infer", data=codec.encode_request(feeds).body)
        assert response.status == 200, await response.text()
        body = await response.json()
        parameters = body["parameters"]
        assert (parameters["plan"], parameters["backends"], parameters["ran_on"]) == (plan, backends, "local")
        assert parameters["retried"] is False and parameters["ran_twice"] is False and "fallback" not in parameters
        output = body["outputs"][0]
        got = np.array(output["data"], np.float32).reshape(output["shape"])
        expected = ort_run(repo_copy / "mlp" / "2" / "model.onnx", feeds)["logits"]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    found = await sampled_metrics(client)
    assert value(found, "edge_runtime_plan_total", model="mlp", version="2", plan=plan) == REQUESTS
    other = "gpu" if plan == "cpu" else "cpu"
    assert value(found, "edge_runtime_plan_total", model="mlp", version="2", plan=other) is None
    assert value(found, "edge_runtime_load_pinned", reading="gpu_busy") == 1
    assert value(found, "edge_runtime_gpu_busy", source="pinned") == pytest.approx(gpu_busy)
    assert 0.0 <= value(found, "edge_runtime_cpu_utilization") <= 1.0
    assert 0.0 <= value(found, "edge_runtime_memory_used_fraction") <= 1.0


async def test_one_monitor_per_server_measures_load_and_stops_on_cleanup(aiohttp_client: Any,
                                                                          make_app: Any) -> None:
    before = _monitor_threads()
    client = await aiohttp_client(make_app(load=LoadConfig(sample_interval_ms=20)))
    assert len(_monitor_threads() - before) == 1  # one LoadMonitor for every model of the server
    found = await sampled_metrics(client)
    assert value(found, "edge_runtime_load_pinned", reading="gpu_busy") is None
    assert 0.0 <= value(found, "edge_runtime_cpu_utilization_own") <= 1.0
    assert 0.0 <= value(found, "edge_runtime_cpu_utilization") <= 1.0
    await client.close()
    assert not _monitor_threads() - before


def _monitor_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "edge-runtime-load" and t.is_alive()}
