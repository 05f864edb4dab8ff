"""The reference client, ``tritonclient.http``, against a live server on loopback (JSON and binary)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from server_fixtures import LiveServer, ort_run, triton_inputs, type_feeds

pytestmark = pytest.mark.aarch64


@pytest.fixture(scope="module")
def triton_client(live_server: LiveServer) -> Any:
    client = triton.InferenceServerClient(live_server.url, connection_timeout=30, network_timeout=60)
    yield client
    client.close()


def test_health_and_metadata(triton_client: Any) -> None:
    assert triton_client.is_server_live() and triton_client.is_server_ready()
    assert "binary_tensor_data" in triton_client.get_server_metadata()["extensions"]
    assert triton_client.is_model_ready("mlp") and triton_client.is_model_ready("mlp", "1")
    assert not triton_client.is_model_ready("absent")
    metadata = triton_client.get_model_metadata("mobilenet")
    assert metadata["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": [-1, 3, 64, 64]}
    assert triton_client.get_model_config("mlp")["name"] == "mlp"


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_equals_onnxruntime(triton_client: Any, repo: Path, binary: bool) -> None:
    image = np.random.default_rng(11).standard_normal((2, 3, 64, 64)).astype(np.float32)
    outputs = [triton.InferRequestedOutput("probabilities", binary_data=binary)]
    result = triton_client.infer("mobilenet", triton_inputs({"input": image}, binary), outputs=outputs,
                                 request_id="t-1", priority=1, timeout=10_000_000)
    assert result.get_response()["id"] == "t-1"
    expected = ort_run(repo / "mobilenet" / "1" / "model.onnx", {"input": image})["probabilities"]
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_every_datatype_through_tritonclient(triton_client: Any, repo: Path, binary: bool) -> None:
    feeds = type_feeds(seed=4)
    wire = {k: (v.astype(str).astype(object) if v.dtype == object else v) for k, v in feeds.items()}
    outputs = [triton.InferRequestedOutput(f"y_{k[2:]}", binary_data=binary) for k in feeds]
    result = triton_client.infer("types", triton_inputs(wire, binary), outputs=outputs)
    for name, want in ort_run(repo / "types" / "1" / "model.onnx", feeds).items():
        got = result.as_numpy(name)
        if want.dtype == object:
            got = np.array([g.decode() if isinstance(g, bytes) else g for g in got.ravel()], object).reshape(2, 3)
        np.testing.assert_array_equal(got, want)


def test_no_requested_outputs_means_all_in_binary(triton_client: Any, repo: Path) -> None:
    x = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    result = triton_client.infer("mlp", triton_inputs({"input": x}, binary=True), model_version="1")
    assert result.get_response()["outputs"][0]["parameters"]["binary_data_size"] == 3 * 10 * 4
    np.testing.assert_allclose(result.as_numpy("logits"), ort_run(repo / "mlp" / "1" / "model.onnx", {"input": x})
                               ["logits"], rtol=1e-5, atol=1e-6)


def test_client_errors_surface_as_400_and_404(triton_client: Any) -> None:
    wrong = np.zeros((1, 64), np.float64)
    with pytest.raises(InferenceServerException, match="expects datatype FP32") as info:
        triton_client.infer("mlp", triton_inputs({"input": wrong}, binary=True))
    assert info.value.status() == "400"
    with pytest.raises(InferenceServerException, match="unknown model") as info:
        triton_client.infer("absent", triton_inputs({"input": wrong}, binary=False))
    assert info.value.status() == "404"


def test_repository_load_unload_index_and_statistics(triton_client: Any) -> None:
    names = {(e["name"], e.get("version"), e.get("state")) for e in triton_client.get_model_repository_index()}
    assert ("mlp", "2", "READY") in names
    triton_client.unload_model("types")
    assert not triton_client.is_model_ready("types")
    triton_client.load_model("types")
    assert triton_client.is_model_ready("types")
    x = np.ones((5, 64), np.float32)
    before = triton_client.get_inference_statistics("mlp", "2")["model_stats"][0]["inference_count"]
    triton_client.infer("mlp", triton_inputs({"input": x}, binary=True))
    stats = triton_client.get_inference_statistics("mlp", "2")["model_stats"][0]
    assert stats["inference_count"] == before + 5
    everything = triton_client.get_inference_statistics()["model_stats"]
    assert {(s["name"], s["version"]) for s in everything} >= {("mlp", "1"), ("mlp", "2")}
