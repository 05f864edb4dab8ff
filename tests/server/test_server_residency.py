"""Residency through the real app: result cache, warm-up before ready, lazy load, memory budget.

The oracle for outputs is the cache's own miss (byte-identical) and plain ONNX
Runtime; a gate (threading.Event), not a sleep, holds a request in flight.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pytest

from edge_runtime.protocol import codec
from server_fixtures import ort_run, write


def body(seed: int, binary: bool = True) -> bytes:
    feeds = {"input": np.random.default_rng(seed).standard_normal((1, 64)).astype(np.float32)}
    # binary outputs: the response carries the raw tensor bytes after its JSON header
    return codec.encode_request(feeds, parameters={"binary_data_output": True} if binary else None).body


@pytest.fixture
def mlp_repo(tmp_path: Path) -> Path:
    """cached/1 (result cache on), plain/1, gated/1 (warm-up off; its plan waits on a gate)."""
    from edge_runtime.model_zoo import build_mlp

    root = tmp_path / "repo"
    for name, seed, config in (("cached", 0, "[result_cache]\nenabled = true\nttl_s = 0.0\n"),
                               ("plain", 1, ""), ("gated", 2, "[warmup]\nenabled = false\n")):
        write(root / name / "1" / "model.onnx", build_mlp(seed=seed))
        (root / name / "config.toml").write_text(config + '[serving]\nbackend = "cpu"\n')
    return root


@dataclass
class GatedPlan:
    name: str
    backends: tuple[str, ...]
    inner: Any
    entered: threading.Event
    release: threading.Event

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.entered.set()
        assert self.release.wait(timeout=60), "the test never opened the gate"
        return self.inner.run(feeds)


@pytest.fixture
def gate() -> tuple[threading.Event, threading.Event]:
    entered, release = threading.Event(), threading.Event()
    yield entered, release
    release.set()


def app_for(runtime: Any, root: Path, gate: Any = None, **memory: Any) -> Any:
    from edge_runtime.memory_budget import MemoryConfig
    from edge_runtime.scheduler import model_plans
    from edge_runtime.server.app import create_app
    from edge_runtime.server.config import ServerConfig
    from edge_runtime.serving.repository import ModelRepository

    def extra(model: Any) -> dict[str, Any]:
        if model.name != "gated" or gate is None:
            return {}
        return {n: GatedPlan(p.name, p.backends, p, *gate) for n, p in model_plans(model).items()}

    repository = ModelRepository(root, runtime, extra_plans=extra, drain_timeout_s=5.0, memory=MemoryConfig(**memory))
    return create_app(ServerConfig(), repository)


async def infer(client: Any, model: str, seed: int, binary: bool = True) -> Any:
    return await client.post(f"/v2/models/{model}/infer", data=body(seed, binary))


def binary_outputs(raw: bytes, header_length: int) -> tuple[dict[str, Any], bytes]:
    import json

    return json.loads(raw[:header_length]), raw[header_length:]


async def test_result_cache_hits_are_byte_identical_to_misses_and_counted(aiohttp_client: Any, runtime: Any,
                                                                          mlp_repo: Path) -> None:
    client = await aiohttp_client(app_for(runtime, mlp_repo))
    answers = []
    for _ in range(3):
        response = await infer(client, "cached", 0)
        assert response.status == 200
        header, data = binary_outputs(await response.read(), int(response.headers["Inference-Header-Content-Length"]))
        answers.append((header, data))
    (miss_header, miss_data), (hit_header, hit_data), _ = answers
    assert hit_data == miss_data == answers[2][1]  # the output tensor bytes, exactly
    assert miss_header["outputs"] == hit_header["outputs"]
    assert miss_header["parameters"]["plan"] != "result_cache" and hit_header["parameters"]["plan"] == "result_cache"
    want = ort_run(mlp_repo / "cached" / "1" / "model.onnx",
                   {"input": np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)})["logits"]
    assert np.frombuffer(miss_data, np.float32).tobytes() == want.astype(np.float32).tobytes()
    json_miss = await (await infer(client, "cached", 1, binary=False)).json()
    json_hit = await (await infer(client, "cached", 1, binary=False)).json()
    assert json_miss["outputs"] == json_hit["outputs"]
    metrics = await (await client.get("/metrics")).text()
    assert 'edge_runtime_result_cache_hits_total{model="cached",version="1"} 3.0' in metrics
    assert 'edge_runtime_result_cache_misses_total{model="cached",version="1"} 2.0' in metrics
    stats = (await (await client.get("/v2/models/cached/stats")).json())["model_stats"][0]
    assert stats["edge_runtime"]["result_cache"]["entries"] == 2
    plain = (await (await client.get("/v2/models/plain/stats")).json())["model_stats"][0]
    assert plain["edge_runtime"]["result_cache"] is None  # off by default


async def test_a_failed_request_is_not_cached(aiohttp_client: Any, runtime: Any, mlp_repo: Path) -> None:
    client = await aiohttp_client(app_for(runtime, mlp_repo))
    bad = codec.encode_request({"input": np.zeros((1, 63), np.float32)}).body
    assert (await client.post("/v2/models/cached/infer", data=bad)).status == 400
    stats = (await (await client.get("/v2/models/cached/stats")).json())["model_stats"][0]
    assert stats["edge_runtime"]["result_cache"]["entries"] == 0


async def test_every_plan_is_warmed_up_before_the_model_is_ready(aiohttp_client: Any, runtime: Any,
                                                                 mlp_repo: Path) -> None:
    (mlp_repo / "plain" / "config.toml").write_text(
        '[warmup]\nshapes = [{ input = [1, 64] }, { input = [4, 64] }]\n[serving]\nbackend = "cpu"\n')
    client = await aiohttp_client(app_for(runtime, mlp_repo))
    assert (await client.get("/v2/models/plain/ready")).status == 200
    warmup = (await (await client.get("/v2/models/plain/stats")).json())["model_stats"][0]["edge_runtime"]["warmup"]
    metadata = await (await client.get("/v2/models/plain")).json()
    assert warmup["done"] and set(warmup["first_run_ms"]) == set(metadata["edge_runtime"]["plans"])
    assert warmup["shapes"] == [{"input": [1, 64]}, {"input": [4, 64]}]
    # ... and once more through the scheduler's device workers, so the first request starts no thread.
    # The warm-off model's scheduler has run nothing.
    from edge_runtime.server.state import STATE

    repository = client.server.app[STATE].repository
    counters = repository.get("plain").dispatcher.scheduler.stats()
    assert {p: counters.get(f"plan:{p}") for p in metadata["edge_runtime"]["plans"]} == \
        {p: 1 for p in metadata["edge_runtime"]["plans"]}
    assert counters.get("success") == len(metadata["edge_runtime"]["plans"]) and not counters.get("failures")
    assert "success" not in repository.get("gated").dispatcher.scheduler.stats()
    served = (await (await client.get("/v2/models/plain/stats")).json())["model_stats"][0]
    assert served["inference_count"] == 0  # warm-up requests are not the clients': not in the statistics
    (mlp_repo / "plain" / "config.toml").write_text('[warmup]\nshapes = [{ input = [1, 65] }]\n')
    response = await client.post("/v2/repository/models/plain/load")
    assert response.status == 400 and "expects" in (await response.json())["error"]


async def test_lazy_load_on_first_request(aiohttp_client: Any, runtime: Any, mlp_repo: Path) -> None:
    client = await aiohttp_client(app_for(runtime, mlp_repo, lazy_load=True))
    assert (await client.get("/v2/models/plain/ready")).status == 404
    responses = await asyncio.gather(*(infer(client, "plain", i) for i in range(3)))  # one load serves all three
    assert [r.status for r in responses] == [200, 200, 200]
    assert (await client.get("/v2/models/plain/ready")).status == 200
    assert (await client.get("/v2/models/cached/ready")).status == 404  # never asked for: never loaded
    assert (await infer(client, "nosuch", 0)).status == 404


async def test_a_tiny_budget_unloads_idle_models_lru_and_never_a_busy_one(aiohttp_client: Any, runtime: Any,
                                                                          mlp_repo: Path, gate: Any) -> None:
    size = (mlp_repo / "plain" / "1" / "model.onnx").stat().st_size
    client = await aiohttp_client(app_for(runtime, mlp_repo, gate, lazy_load=True, budget_bytes=int(size * 1.5),
                                          footprint_factor=1.0))  # room for one model at a time
    assert (await infer(client, "plain", 0)).status == 200
    assert (await infer(client, "cached", 0)).status == 200  # plain was idle: unloaded to make room
    assert (await client.get("/v2/models/plain/ready")).status == 404
    entered, release = gate
    in_flight = asyncio.ensure_future(infer(client, "gated", 0))  # cached unloaded; gated loads and blocks
    assert await asyncio.to_thread(entered.wait, 60)
    refused = await infer(client, "plain", 1)  # needs room; only the busy gated model could give it
    assert refused.status == 429 and "Retry-After" in refused.headers
    assert "busy models ['gated']" in (await refused.json())["error"]
    assert (await client.get("/v2/models/gated/ready")).status == 200  # still loaded, still answering
    release.set()
    assert (await in_flight).status == 200
    assert (await infer(client, "plain", 1)).status == 200  # gated is idle now: it goes
    assert (await client.get("/v2/models/gated/ready")).status == 404
    metrics = await (await client.get("/metrics")).text()
    assert "edge_runtime_memory_budget_unloads_total 3.0" in metrics
    assert 'edge_runtime_model_memory_charged_bytes{model="plain"}' in metrics
    assert 'edge_runtime_model_memory_bytes{model="plain",version="1"}' in metrics
    index = await (await client.post("/v2/repository/index", json={})).json()
    reasons = {e["name"]: e["reason"] for e in index}
    assert "memory budget" in reasons["gated"]


async def test_shape_buckets_pad_requests_and_warm_up_every_bucket(aiohttp_client: Any, runtime: Any,
                                                                   tmp_path: Path) -> None:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("GlobalMaxPool", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "maxpool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 1, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    root = tmp_path / "repo"
    write(root / "pool" / "1" / "model.onnx", model)
    (root / "pool" / "config.toml").write_text(
        '[shape_buckets]\npad = true\ndims = [{ input = "x", axis = 3, sizes = [8, 16] }]\n'
        '[serving]\nbackend = "cpu"\n')
    client = await aiohttp_client(app_for(runtime, root))
    stats = (await (await client.get("/v2/models/pool/stats")).json())["model_stats"][0]
    assert stats["edge_runtime"]["warmup"]["shapes"] == [{"x": [1, 2, 4, 8]}, {"x": [1, 2, 4, 16]}]
    x = np.random.default_rng(3).standard_normal((1, 2, 4, 11)).astype(np.float32)
    response = await client.post("/v2/models/pool/infer", data=codec.encode_request({"x": x}).body)
    assert response.status == 200
    got = np.asarray((await response.json())["outputs"][0]["data"], np.float32).reshape(1, 2, 1, 1)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
