"""Warm-up and the batching experiment run the model at shapes it takes, never at arbitrary sizes.

A model declared ``[-1, 3, ?, ?]`` whose pooling rejects small images (as PP-OCR's
classifier does): with no ``[warmup] shapes`` nothing runs it at load at a made-up
size (no WARNING, no failed plan), and the first real request's shapes are used,
behind it, for the warm-up and the batching experiment. The oracle for the
experiment's outcome is ONNX Runtime on each request alone and Triton's counters
(rows over executions) for whether batches formed.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.protocol import codec
from server_fixtures import ort_run, write
from test_server_metrics import samples, value

SIDE = 20  # the served image side; MaxPool 7x7 without padding takes no side under 7
BATCHING = "[batching]\nmax_batch_size = 8\nmax_queue_delay_us = 200000\n"


def pooling_model() -> Any:
    """``x [-1, 3, ?, ?]`` -> Conv 3x3 -> MaxPool 7x7 (no padding) -> GlobalAveragePool -> ``y [-1, 4]``."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    weight = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    shape = numpy_helper.from_array(np.array([-1, 4], dtype=np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[7, 7]),
         helper.make_node("GlobalAveragePool", ["p"], ["g"]),
         helper.make_node("Reshape", ["g", "shape"], ["y"])], "pooling",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4])], [weight, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _image(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, 3, SIDE, SIDE)).astype(np.float32)}


async def _metadata(client: Any) -> dict[str, Any]:
    return (await (await client.get("/v2/models/pool")).json())["edge_runtime"]


async def _stats(client: Any) -> dict[str, Any]:
    return (await (await client.get("/v2/models/pool/stats")).json())["model_stats"][0]["edge_runtime"]


def test_the_pooling_model_rejects_the_sizes_the_old_warm_up_made_up(tmp_path: Path) -> None:
    """Premise of the tests below: the model really rejects 1x1 (ONNX Runtime is the judge)."""
    write(tmp_path / "m.onnx", pooling_model())
    with pytest.raises(Exception, match="(?i)pool|shape|dim"):
        ort_run(tmp_path / "m.onnx", {"x": np.zeros((1, 3, 1, 1), np.float32)})
    assert ort_run(tmp_path / "m.onnx", _image(0))["y"].shape == (1, 4)


@pytest.mark.parametrize("config", ["", BATCHING], ids=["no-config", "batching-only"])
async def test_no_warning_at_load_and_the_first_request_sets_the_shapes(
        aiohttp_client: Any, make_app: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, config: str) -> None:
    root = tmp_path / "repository"
    write(root / "pool" / "1" / "model.onnx", pooling_model())
    if config:
        (root / "pool" / "config.toml").write_text(config)
    caplog.set_level(logging.DEBUG, logger="edge_runtime")
    client = await aiohttp_client(make_app(root=root, extra_plans=None))
    metadata = await _metadata(client)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [], warned
    stats = await _stats(client)
    assert stats["warmup"]["deferred"] is True and stats["warmup"]["done"] is False
    if config:
        assert metadata["batching"]["enabled"] is False and metadata["batching"]["deferred"] is True
    first = _image(1)
    response = await client.post("/v2/models/pool/infer", data=codec.encode_request(first).body)
    assert response.status == 200, await response.text()
    got = np.asarray((await response.json())["outputs"][0]["data"], np.float32).reshape(1, 4)
    np.testing.assert_allclose(got, ort_run(root / "pool" / "1" / "model.onnx", first)["y"], rtol=1e-4, atol=1e-5)
    # The deferred work runs behind the request, as requests of its own through the same queue.
    for _ in range(400):
        done = not (await _metadata(client))["batching"]["deferred"] if config else any(
            "warm-up at the first request's shapes" in r.getMessage() for r in caplog.records)
        if done:
            break
        await asyncio.sleep(0.025)
    assert done
    warm = [r.getMessage() for r in caplog.records if "warm-up at the first request's shapes" in r.getMessage()]
    assert warm and f"(1, 3, {SIDE}, {SIDE})" in warm[0]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    if config:
        batching = (await _metadata(client))["batching"]
        assert batching["enabled"] is True, batching


async def test_after_the_deferred_probe_concurrent_requests_batch_and_answer_as_alone(
        aiohttp_client: Any, make_app: Any, tmp_path: Path) -> None:
    root = tmp_path / "repository"
    path = root / "pool" / "1" / "model.onnx"
    write(path, pooling_model())
    (root / "pool" / "config.toml").write_text(BATCHING)
    client = await aiohttp_client(make_app(root=root, extra_plans=None))
    response = await client.post("/v2/models/pool/infer", data=codec.encode_request(_image(100)).body)
    assert response.status == 200
    for _ in range(400):
        if not (await _metadata(client))["batching"]["deferred"]:
            break
        await asyncio.sleep(0.025)
    before = samples(await (await client.get("/metrics")).text())

    async def one(seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        feeds = _image(seed)
        answer = await client.post("/v2/models/pool/infer", data=codec.encode_request(feeds).body)
        assert answer.status == 200, await answer.text()
        return feeds, np.asarray((await answer.json())["outputs"][0]["data"], np.float32).reshape(1, 4)

    for feeds, got in await asyncio.gather(*(one(seed) for seed in range(16))):
        np.testing.assert_allclose(got, ort_run(path, feeds)["y"], rtol=1e-4, atol=1e-5)
    after = samples(await (await client.get("/metrics")).text())
    rows = value(after, "nv_inference_count", model="pool", version="1") - value(
        before, "nv_inference_count", model="pool", version="1")
    executions = value(after, "nv_inference_exec_count", model="pool", version="1") - value(
        before, "nv_inference_exec_count", model="pool", version="1")
    assert rows == 16 and executions and rows / executions >= 2, (rows, executions)
