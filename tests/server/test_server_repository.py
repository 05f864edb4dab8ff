"""Model repository through the API: index, versions, explicit load/unload, failed reloads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.model_zoo import build_mlp
from edge_runtime.protocol import codec
from server_fixtures import ort_run, write


async def infer_mlp(client: Any, path: str, seed: int = 0) -> tuple[int, dict[str, Any], dict[str, np.ndarray]]:
    feeds = {"input": np.random.default_rng(seed).standard_normal((2, 64)).astype(np.float32)}
    response = await client.post(path, data=codec.encode_request(feeds).body)
    return response.status, await response.json(), feeds


def logits(body: dict[str, Any]) -> np.ndarray:
    output = body["outputs"][0]
    return np.array(output["data"], np.float32).reshape(output["shape"])


async def index(client: Any, **body: Any) -> list[dict[str, Any]]:
    response = await client.post("/v2/repository/index", data=json.dumps(body) if body else b"")
    assert response.status == 200
    return await response.json()


async def test_index_lists_every_version_with_its_state(aiohttp_client: Any, make_app: Any, repo_copy: Path) -> None:
    write(repo_copy / "mobilenet" / "2" / "model.onnx", build_mlp(seed=9))  # latest policy: only 2 is served
    (repo_copy / "broken" / "1").mkdir(parents=True)
    (repo_copy / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    client = await aiohttp_client(make_app(repo_copy))
    entries = {(e["name"], e["version"]): e for e in await index(client)}
    assert entries[("mlp", "1")]["state"] == entries[("mlp", "2")]["state"] == "READY"
    assert entries[("mobilenet", "2")]["state"] == "READY"
    assert entries[("mobilenet", "1")] == {"name": "mobilenet", "version": "1", "state": "UNAVAILABLE",
                                           "reason": "not selected by version_policy"}
    assert entries[("broken", "1")]["state"] == "UNAVAILABLE"
    assert "cannot parse ONNX model" in entries[("broken", "1")]["reason"]
    ready = await index(client, ready=True)
    assert {e["state"] for e in ready} == {"READY"} and ("broken", "1") not in {(e["name"], e["version"]) for e in ready}
    assert (await client.get("/v2/models/mobilenet/versions/1")).status == 404


async def test_unload_then_load_again(aiohttp_client: Any, make_app: Any, repo: Path) -> None:
    client = await aiohttp_client(make_app())
    response = await client.post("/v2/repository/models/mlp/unload", data=json.dumps(
        {"parameters": {"unload_dependents": False}}))
    assert response.status == 200
    status, body, _ = await infer_mlp(client, "/v2/models/mlp/infer")
    assert status == 404 and "unknown model 'mlp'" in body["error"]
    assert {e["state"] for e in await index(client) if e["name"] == "mlp"} == {"UNAVAILABLE"}
    response = await client.post("/v2/repository/models/mlp/load")
    assert response.status == 200 and (await response.json())["versions"] == ["1", "2"]
    status, body, feeds = await infer_mlp(client, "/v2/models/mlp/versions/1/infer", seed=2)
    assert status == 200
    np.testing.assert_allclose(logits(body), ort_run(repo / "mlp" / "1" / "model.onnx", feeds)["logits"],
                               rtol=1e-5, atol=1e-6)
    response = await client.post("/v2/repository/models/mlp/unload")
    response = await client.post("/v2/repository/models/mlp/unload")
    assert response.status == 404 and "not loaded" in (await response.json())["error"]


async def test_reload_picks_up_a_new_version(aiohttp_client: Any, make_app: Any, repo_copy: Path) -> None:
    client = await aiohttp_client(make_app(repo_copy))
    write(repo_copy / "mlp" / "3" / "model.onnx", build_mlp(seed=11))
    response = await client.post("/v2/repository/models/mlp/load")
    assert (await response.json())["versions"] == ["1", "2", "3"]
    status, body, feeds = await infer_mlp(client, "/v2/models/mlp/infer", seed=3)
    assert status == 200 and body["model_version"] == "3"
    np.testing.assert_allclose(logits(body), ort_run(repo_copy / "mlp" / "3" / "model.onnx", feeds)["logits"],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("breakage, message", [
    ("corrupt", "cannot parse ONNX model"),
    ("config", "unknown key(s) ['max_queue_sise']"),
    ("empty", "no model.onnx or model.tflite"),
])
async def test_failed_reload_keeps_the_old_versions_serving(aiohttp_client: Any, make_app: Any, repo_copy: Path,
                                                            breakage: str, message: str) -> None:
    client = await aiohttp_client(make_app(repo_copy))
    (repo_copy / "mlp" / "3").mkdir()
    if breakage == "corrupt":
        (repo_copy / "mlp" / "3" / "model.onnx").write_bytes(b"\x08\x01garbage")
    elif breakage == "config":
        with open(repo_copy / "mlp" / "config.toml", "a") as handle:
            handle.write("[queue]\nmax_queue_sise = 3\n")
    response = await client.post("/v2/repository/models/mlp/load")
    assert response.status == 400
    assert message in (await response.json())["error"]
    status, body, feeds = await infer_mlp(client, "/v2/models/mlp/infer", seed=5)
    assert status == 200 and body["model_version"] == "2"
    np.testing.assert_allclose(logits(body), ort_run(repo_copy / "mlp" / "2" / "model.onnx", feeds)["logits"],
                               rtol=1e-5, atol=1e-6)
    entries = {(e["name"], e["version"]): e for e in await index(client)}
    assert entries[("mlp", "2")]["state"] == "READY"
    assert message in entries[("mlp", "3")]["reason"]


@pytest.mark.parametrize("name, status", [("..%2F..%2Fetc", 400), ("a%20b", 400), ("...", 400), ("nosuch", 404)])
async def test_load_rejects_unsafe_and_unknown_names(aiohttp_client: Any, make_app: Any, repo_copy: Path,
                                                     name: str, status: int) -> None:
    outside = repo_copy.parent / "etc"
    write(outside / "1" / "model.onnx", build_mlp())  # a model outside the repository must stay unreachable
    client = await aiohttp_client(make_app(repo_copy))
    response = await client.post(f"/v2/repository/models/{name}/load")
    assert response.status == status
    error = (await response.json())["error"]
    assert ("invalid model name" in error) if status == 400 else ("no model 'nosuch'" in error)
    assert "etc" not in {e["name"] for e in await index(client)}


async def test_load_overrides_are_refused_clearly(client: Any) -> None:
    response = await client.post("/v2/repository/models/mlp/load", data=json.dumps({"parameters": {"config": "{}"}}))
    assert response.status == 400
    assert "not supported: edit mlp/config.toml" in (await response.json())["error"]
    for parameters in (-1.5, 3, "config", [["config"]]):  # not an object: a named 400, never a 500
        response = await client.post("/v2/repository/models/mlp/load", data=json.dumps({"parameters": parameters}))
        assert response.status == 400 and "'parameters' must be an object" in (await response.json())["error"]


async def test_specific_version_policy_and_tflite_free_layout(aiohttp_client: Any, make_app: Any,
                                                              repo_copy: Path) -> None:
    write(repo_copy / "mlp" / "3" / "model.onnx", build_mlp(seed=11))
    (repo_copy / "mlp" / "config.toml").write_text('[serving]\nversion_policy = [1, 3]\n')
    shutil.rmtree(repo_copy / "mobilenet")
    client = await aiohttp_client(make_app(repo_copy))
    metadata = await (await client.get("/v2/models/mlp")).json()
    assert metadata["versions"] == ["1", "3"]
    assert (await client.get("/v2/models/mlp/versions/2/ready")).status == 404
    (repo_copy / "mlp" / "config.toml").write_text('[serving]\nversion_policy = [4]\n')
    response = await client.post("/v2/repository/models/mlp/load")
    assert response.status == 404 and "names version(s) [4]" in (await response.json())["error"]
    assert (await client.get("/v2/models/mlp/versions/3/ready")).status == 200


@pytest.mark.parametrize("text, table, key", [
    ("[batchng]\nmax_batch_size = 8\n", "[batchng]", None),
    ("max_batch_size = 8\n", None, "'max_batch_size'"),
    ("[batching]\nmax_batch_sise = 8\n", "[batching]", "'max_batch_sise'"),
    ("[cloud]\nmode = \"never\"\nremote = \"x\"\n", "[cloud]", "'remote'"),
    ("[serving]\nbackend = \"cpu\"\nversions = \"all\"\n", "[serving]", "'versions'"),
])
async def test_unknown_config_tables_and_keys_fail_the_load_naming_file_table_and_key(
        aiohttp_client: Any, make_app: Any, repo_copy: Path, text: str, table: str | None, key: str | None) -> None:
    client = await aiohttp_client(make_app(repo_copy))
    config = repo_copy / "types" / "config.toml"
    config.write_text(text)
    response = await client.post("/v2/repository/models/types/load")
    assert response.status == 400
    error = (await response.json())["error"]
    assert str(config) in error, error
    for needle in (table, key):
        assert needle is None or needle in error, error


async def test_a_model_folder_without_version_folders_is_served_as_version_1(
        aiohttp_client: Any, make_app: Any, repo_copy: Path) -> None:
    """The layout users bring as it is (Hugging Face / transformers.js / MLServer: the files directly in
    ``<repo>/<name>/``) serves as version 1; version folders, once there, are what is served."""
    from edge_runtime.decoder_zoo import DecoderShape, write_decoder_folder
    from edge_runtime.generation.model import GenerativeModel

    write(repo_copy / "flat" / "model.onnx", build_mlp(seed=3))
    chat = write_decoder_folder(repo_copy / "chat", DecoderShape(hidden=32, layers=1, heads=2, kv_heads=1,
                                                                 intermediate=64, vocab=300, max_positions=64), seed=1)
    (repo_copy / "notes").mkdir()  # a folder without a model is no model: not listed
    client = await aiohttp_client(make_app(repo_copy))
    entries = {(e["name"], e["version"]): e["state"] for e in await index(client)}
    assert entries[("flat", "1")] == entries[("chat", "1")] == "READY" and "notes" not in {n for n, _ in entries}
    status, body, feeds = await infer_mlp(client, "/v2/models/flat/infer")
    assert status == 200 and body["model_version"] == "1"
    np.testing.assert_allclose(logits(body), ort_run(repo_copy / "flat" / "model.onnx", feeds)["logits"],
                               rtol=1e-5, atol=1e-6)
    response = await client.post("/v1/chat/completions", json={
        "model": "chat", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]})
    assert response.status == 200
    oracle = GenerativeModel("oracle", chat, threads=1)
    try:
        expected = oracle.generate(messages=[{"role": "user", "content": "hi"}], max_tokens=4).text
    finally:
        oracle.close()
    assert (await response.json())["choices"][0]["message"]["content"] == expected
    # Version folders added later are what the next load serves.
    write(repo_copy / "flat" / "2" / "model.onnx", build_mlp(seed=4))
    assert (await (await client.post("/v2/repository/models/flat/load")).json())["versions"] == ["2"]
    status, body, feeds = await infer_mlp(client, "/v2/models/flat/infer")
    assert status == 200 and body["model_version"] == "2"
    np.testing.assert_allclose(logits(body), ort_run(repo_copy / "flat" / "2" / "model.onnx", feeds)["logits"],
                               rtol=1e-5, atol=1e-6)


async def test_a_repository_that_is_itself_a_model_folder_is_named(aiohttp_client: Any, make_app: Any,
                                                                   tmp_path: Path, caplog) -> None:
    root = tmp_path / "mymodel"
    write(root / "model.onnx", build_mlp(seed=3))
    with caplog.at_level("WARNING", logger="edge_runtime.serving.repository"):
        client = await aiohttp_client(make_app(root))
    said = f"the model repository {root} is itself a model folder: serve the folder that holds it"
    assert any(said in r.getMessage() for r in caplog.records)
    status, body, _ = await infer_mlp(client, "/v2/models/anything/infer")
    assert status == 404 and said in body["error"]
    assert [(e["name"], e["state"]) for e in await index(client)] == [("mymodel", "UNAVAILABLE")]
