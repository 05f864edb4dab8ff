"""Batching on real exports: a ``-1`` batch dim batches; a model that mixes rows is refused, with its reason.

The oracle for "batching formed" is Triton's own pair of counters on ``/metrics``
(``nv_inference_count`` rows over ``nv_inference_exec_count`` executions); the
oracle for the answers is ONNX Runtime run on each request alone.
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

BATCHING = "[batching]\nmax_batch_size = 16\nmax_queue_delay_us = 500000\n[serving]\nbackend = \"cpu\"\n"
REQUESTS = 16


def minus_one_batch_model() -> Any:
    """``y = relu(x @ W + b)`` with ``x`` declared ``[-1, 8]`` (``dim_value: -1``), as paddle2onnx writes it."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    weight = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])], "minus_one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4])], [weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def row_mixing_model() -> Any:
    """``y = x - mean(x, axis=0)``: dim 0 is dynamic (``batch``) but not a batch dim."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
         helper.make_node("Sub", ["x", "m"], ["y"])], "mixing",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def batching_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repository"
    for name, model in (("minus_one", minus_one_batch_model()), ("mixing", row_mixing_model())):
        write(root / name / "1" / "model.onnx", model)
        (root / name / "config.toml").write_text(BATCHING)
    return root


def _feeds(seed: int, rows: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((rows, 8)).astype(np.float32)}


async def _infer_all(client: Any, model: str) -> list[tuple[dict[str, np.ndarray], dict[str, Any]]]:
    async def one(seed: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        feeds = _feeds(seed)
        response = await client.post(f"/v2/models/{model}/infer", data=codec.encode_request(feeds).body)
        assert response.status == 200, await response.text()
        return feeds, await response.json()

    return await asyncio.gather(*(one(seed) for seed in range(REQUESTS)))


async def test_a_minus_one_batch_dim_batches_and_answers_each_request_as_alone(
        aiohttp_client: Any, make_app: Any, batching_repo: Path) -> None:
    client = await aiohttp_client(make_app(root=batching_repo))
    metadata = await (await client.get("/v2/models/minus_one")).json()
    assert metadata["inputs"][0]["shape"] == [-1, 8]
    assert metadata["edge_runtime"]["batching"]["enabled"] is True, metadata["edge_runtime"]["batching"]
    spin = metadata["edge_runtime"]["spin"]  # the spin policy: a spinning session and a quiet twin (spin.py)
    assert spin["mode"] == "load" and set(spin["runs"]) == {"spinning", "quiet"}, spin
    path = batching_repo / "minus_one" / "1" / "model.onnx"
    for feeds, document in await _infer_all(client, "minus_one"):
        got = np.asarray(document["outputs"][0]["data"], dtype=np.float32).reshape(1, 4)
        np.testing.assert_allclose(got, ort_run(path, feeds)["y"], rtol=1e-5, atol=1e-5)
    found = samples(await (await client.get("/metrics")).text())
    rows = value(found, "nv_inference_count", model="minus_one", version="1")
    executions = value(found, "nv_inference_exec_count", model="minus_one", version="1")
    assert rows == REQUESTS
    assert executions and rows / executions >= 2, (rows, executions)
    after = (await (await client.get("/v2/models/minus_one")).json())["edge_runtime"]["spin"]
    # Every execution ran on the spinning session, its quiet twin or the one-thread session
    # (scheduler/single_thread.py: the pool side of that switch is the spin policy's).
    ran = sum(after["runs"].values()) - sum(spin["runs"].values())
    ran += after["single_thread"]["runs"]["single"] - spin["single_thread"]["runs"]["single"]
    assert ran == executions, (spin, after)
    assert after["cost_ms_per_row"], after  # the batcher's cost curve, measured at load and live


async def test_a_model_that_mixes_rows_is_refused_batching_with_its_reason(
        aiohttp_client: Any, make_app: Any, batching_repo: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="edge_runtime"):
        client = await aiohttp_client(make_app(root=batching_repo))
    decision = (await (await client.get("/v2/models/mixing")).json())["edge_runtime"]["batching"]
    assert decision["enabled"] is False
    assert "mixes rows" in decision["reason"] and "'y'" in decision["reason"]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "mixing" in r.getMessage()]
    assert warned and "max_batch_size = 16" in warned[0].getMessage()
    path = batching_repo / "mixing" / "1" / "model.onnx"
    for feeds, document in await _infer_all(client, "mixing"):
        got = np.asarray(document["outputs"][0]["data"], dtype=np.float32).reshape(1, 8)
        np.testing.assert_allclose(got, ort_run(path, feeds)["y"], rtol=1e-5, atol=1e-6)
        assert document["parameters"]["batch_size"] == 1
    found = samples(await (await client.get("/metrics")).text())
    assert value(found, "nv_inference_exec_count", model="mixing", version="1") == REQUESTS
