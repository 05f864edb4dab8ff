"""``/metrics`` parsed with prometheus_client's parser, and Triton-shaped ``/stats``."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from edge_runtime.errors import BackendError
from edge_runtime.protocol import codec


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: dict, name: str, **labels: str) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


async def sampled_metrics(client: Any, timeout_s: float = 5.0) -> dict:
    """``/metrics`` once the LoadMonitor has CPU shares (they need two samples, one interval apart)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = samples(await (await client.get("/metrics")).text())
        if value(found, "edge_runtime_cpu_utilization") is not None or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.05)


async def infer(client: Any, path: str, rows: int, seed: int = 0) -> int:
    feeds = {"input": np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)}
    return (await client.post(path, data=codec.encode_request(feeds).body)).status


async def test_metrics_count_requests_inferences_failures_and_durations(client: Any) -> None:
    for rows in (1, 4, 2):
        assert await infer(client, "/v2/models/mlp/versions/1/infer", rows) == 200
    bad = await client.post("/v2/models/mlp/versions/1/infer", data=json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 63], "data": [0.0] * 63}]}))
    assert bad.status == 400
    response = await client.get("/metrics")
    assert response.status == 200 and response.content_type == "text/plain"
    found = samples(await response.text())
    mlp1 = {"model": "mlp", "version": "1"}
    assert value(found, "nv_inference_request_success", **mlp1) == 3
    assert value(found, "nv_inference_request_failure", reason="INVALID", **mlp1) == 1
    assert value(found, "nv_inference_count", **mlp1) == 7  # rows of the dynamic batch dimension
    assert value(found, "nv_inference_exec_count", **mlp1) == 3
    assert value(found, "nv_inference_request_success", model="mlp", version="2") == 0
    assert value(found, "nv_inference_pending_request_count", **mlp1) == 0
    queue_us = value(found, "nv_inference_queue_duration_us", **mlp1)
    compute_us = value(found, "nv_inference_compute_infer_duration_us", **mlp1)
    request_us = value(found, "nv_inference_request_duration_us", **mlp1)
    assert 0 < compute_us < request_us and 0 <= queue_us < request_us
    assert value(found, "edge_runtime_plan_total", plan="cpu", **mlp1) == 3
    assert 0.0 <= value(await sampled_metrics(client), "edge_runtime_cpu_utilization") <= 1.0
    assert value(found, "edge_runtime_memory_total_bytes") > value(found, "edge_runtime_memory_used_bytes") > 0
    assert value(found, "process_resident_memory_bytes") > 0


async def test_each_app_has_its_own_registry(aiohttp_client: Any, make_app: Any) -> None:
    first = await aiohttp_client(make_app())
    second = await aiohttp_client(make_app())
    assert await infer(first, "/v2/models/mlp/infer", 1) == 200
    found = samples(await (await second.get("/metrics")).text())
    assert value(found, "nv_inference_request_success", model="mlp", version="2") == 0


async def test_stats_follow_tritons_statistics_extension(client: Any) -> None:
    for rows in (2, 3):
        assert await infer(client, "/v2/models/mlp/infer", rows) == 200
    body = await (await client.get("/v2/models/mlp/stats")).json()
    by_version = {s["version"]: s for s in body["model_stats"]}
    assert set(by_version) == {"1", "2"}
    stats = by_version["2"]
    assert (stats["name"], stats["inference_count"], stats["execution_count"]) == ("mlp", 5, 2)
    inference = stats["inference_stats"]
    assert inference["success"]["count"] == 2 and inference["fail"]["count"] == 0
    assert inference["success"]["ns"] >= inference["compute_infer"]["ns"] > 0
    assert inference["queue"]["count"] == 2
    assert sum(b["compute_infer"]["count"] for b in stats["batch_stats"]) == 2
    assert stats["last_inference"] > 0
    everything = await (await client.get("/v2/models/stats")).json()
    assert {(s["name"], s["version"]) for s in everything["model_stats"]} >= {("mlp", "1"), ("mlp", "2"),
                                                                             ("mobilenet", "1"), ("types", "1")}
    one = await (await client.get("/v2/models/mlp/versions/1/stats")).json()
    assert [s["version"] for s in one["model_stats"]] == ["1"]


@dataclass(frozen=True)
class BrokenGpuPlan:
    name: str = "gpu"
    backends: tuple[str, ...] = ("opencl",)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise BackendError("CL_OUT_OF_RESOURCES (-5): enqueue failed")


def gpu_first_plans(model: Any) -> dict[str, Any]:
    return {"gpu": BrokenGpuPlan()} if model.name == "mlp" else {}


async def test_backend_fallback_is_answered_and_counted(aiohttp_client: Any, make_app: Any, repo_copy: Any) -> None:
    (repo_copy / "mlp" / "config.toml").write_text(
        '[scheduler]\npolicy = "fixed"\nplan = "gpu"\n[serving]\nbackend = "cpu"\n')
    client = await aiohttp_client(make_app(repo_copy, extra_plans=gpu_first_plans))
    response = await client.post("/v2/models/mlp/infer", data=codec.encode_request(
        {"input": np.ones((1, 64), np.float32)}).body)
    assert response.status == 200
    parameters = (await response.json())["parameters"]
    assert parameters["plan"] == "cpu" and "CL_OUT_OF_RESOURCES" in parameters["fallback"]
    found = samples(await (await client.get("/metrics")).text())
    assert value(found, "edge_runtime_backend_fallback_total", model="mlp", backend="opencl",
                 reason="CL_OUT_OF_RESOURCES (-5)") == 1
