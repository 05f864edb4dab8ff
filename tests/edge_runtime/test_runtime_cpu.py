"""The Runtime on the cpu backend against a plain onnxruntime.InferenceSession (the oracle)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edge_runtime.errors import ModelLoadError, ModelNotFoundError, UnsupportedNodesError
from edge_runtime.feeds import random_feeds


@pytest.mark.parametrize("name,batch", [("mlp", 1), ("mlp", 5), ("mobilenet", 1), ("mobilenet", 3),
                                        ("transformer", 2)])
@pytest.mark.aarch64
def test_cpu_backend_equals_plain_onnxruntime(runtime, model_dir: Path, name: str, batch: int) -> None:
    path = model_dir / f"{name}.onnx"
    model = runtime.load(path, backend="cpu")
    feeds = random_feeds(model.inputs, seed=batch, dynamic_dim=batch)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    got = model.run(feeds)
    assert set(got) == set(expected)
    for key in expected:
        assert got[key].shape == expected[key].shape
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-6)
    assert model.backend == "cpu"
    assert model.backend_nodes == {"cpu": len(__import__("onnx").load(str(path)).graph.node)}


def test_second_load_reads_the_optimised_model_from_cache(tmp_path: Path, model_dir: Path) -> None:
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    rt = Runtime(RuntimeConfig(cache_dir=tmp_path / "cache"))
    first = rt.load(model_dir / "mobilenet.onnx", backend="cpu")
    cached = list((tmp_path / "cache" / "cpu").glob("*.onnx"))
    assert len(cached) == 1, "the optimised graph is written on first load"
    second = rt.load(model_dir / "mobilenet.onnx", backend="cpu")
    assert first.describe()["executable"]["optimised_model_from_cache"] is False
    assert second.describe()["executable"]["optimised_model_from_cache"] is True
    feeds = random_feeds(first.inputs, seed=3, dynamic_dim=2)
    np.testing.assert_allclose(second.run(feeds)["probabilities"], first.run(feeds)["probabilities"], rtol=1e-6)
    rt.close()


def test_corrupt_cache_entry_is_rebuilt_not_fatal(tmp_path: Path, model_dir: Path) -> None:
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    rt = Runtime(RuntimeConfig(cache_dir=tmp_path / "cache"))
    rt.load(model_dir / "mlp.onnx", backend="cpu")
    (entry,) = (tmp_path / "cache" / "cpu").glob("*.onnx")
    entry.write_bytes(b"not a model")
    model = rt.load(model_dir / "mlp.onnx", backend="cpu")
    feeds = random_feeds(model.inputs, seed=0)
    assert model.run(feeds)["logits"].shape == (1, 10)
    rt.close()


def test_missing_model_names_the_path(runtime, tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(ModelNotFoundError, match="nope.onnx"):
        runtime.load(missing)


def test_corrupt_model_names_the_path_and_cause(runtime, tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07garbage that is not a protobuf \xff\xfe")
    with pytest.raises(ModelLoadError, match="corrupt.onnx"):
        runtime.load(corrupt)


def test_named_backend_that_cannot_take_every_node_lists_them(runtime, model_dir: Path) -> None:
    # The null fake takes everything; use a custom-domain node that ORT's CPU provider lacks.
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Frobnicate", ["x"], ["y"], name="custom_op", domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = model_dir.parent / "custom.onnx"
    onnx.save(model, str(path))
    with pytest.raises(UnsupportedNodesError, match=r"custom_op \(Frobnicate\)"):
        runtime.load(path, backend="cpu")


def test_auto_picks_a_backend_from_the_profile_order_and_says_why(runtime, model_dir: Path) -> None:
    model = runtime.load(model_dir / "mlp.onnx", backend="auto")
    assert model.backend in runtime.backend_order()
    assert runtime.match.name in model.report.reason
    feeds = random_feeds(model.inputs, seed=1)
    session = ort.InferenceSession(str(model_dir / "mlp.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(model.run(feeds)["logits"], session.run(None, feeds)[0], rtol=1e-4, atol=1e-5)


def test_run_async_does_not_block_the_event_loop(runtime, model_dir: Path) -> None:
    model = runtime.load(model_dir / "transformer.onnx", backend="cpu")
    feeds = random_feeds(model.inputs, seed=0, dynamic_dim=8)
    expected = model.run(feeds)["hidden"]

    async def scenario() -> tuple[list[float], list[dict]]:
        ticks: list[float] = []

        async def ticker() -> None:
            for _ in range(20):
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.002)

        results = await asyncio.gather(ticker(), *(model.run_async(feeds) for _ in range(8)))
        return ticks, list(results[1:])

    ticks, results = asyncio.run(scenario())
    for result in results:
        np.testing.assert_allclose(result["hidden"], expected, rtol=1e-6)
    gaps = np.diff(ticks)
    # The ticker wakes every ~2 ms; a blocked loop would show gaps of whole inference runs.
    assert len(ticks) == 20 and float(np.median(gaps)) < 0.05
