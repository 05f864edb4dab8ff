"""Triton's system shared-memory extension, with the reference client's own shm helpers.

Oracles: the same server's binary-HTTP answer and ONNX Runtime; every mistake
must be a 400 whose message names the region and the numbers at fault.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm

from edge_runtime.protocol import codec
from server_fixtures import LiveServer, ort_run, triton_inputs, write

ROWS, FEATURES, CLASSES = 3, 64, 10


def test_tritonclient_shared_memory_inference_equals_http_and_onnxruntime(
        live_server: LiveServer, repo: Path, regions: Any) -> None:
    client = triton.InferenceServerClient(live_server.url, connection_timeout=30, network_timeout=60)
    try:
        x = np.random.default_rng(3).standard_normal((ROWS, FEATURES)).astype(np.float32)
        in_name, in_key, in_handle = regions(x.nbytes + 128)
        out_name, out_key, out_handle = regions(ROWS * CLASSES * 4 + 64)
        shm.set_shared_memory_region(in_handle, [x], offset=128)
        client.register_system_shared_memory(in_name, in_key, x.nbytes + 128)
        client.register_system_shared_memory(out_name, out_key, ROWS * CLASSES * 4 + 64)
        status = {r["name"]: r for r in client.get_system_shared_memory_status()}
        assert status[in_name] == {"name": in_name, "key": in_key, "offset": 0, "byte_size": x.nbytes + 128}

        item = triton.InferInput("input", [ROWS, FEATURES], "FP32")
        item.set_shared_memory(in_name, x.nbytes, offset=128)
        wanted = triton.InferRequestedOutput("logits", binary_data=True)
        wanted.set_shared_memory(out_name, ROWS * CLASSES * 4, offset=64)
        result = client.infer("mlp", [item], outputs=[wanted], model_version="1")
        described = result.get_output("logits")
        assert described["parameters"]["shared_memory_region"] == out_name
        assert described["shape"] == [ROWS, CLASSES]
        got = shm.get_contents_as_numpy(out_handle, np.float32, [ROWS, CLASSES], offset=64)

        over_http = client.infer("mlp", triton_inputs({"input": x}, binary=True), model_version="1")
        np.testing.assert_array_equal(got, over_http.as_numpy("logits"))
        np.testing.assert_allclose(got, ort_run(repo / "mlp" / "1" / "model.onnx", {"input": x})["logits"],
                                   rtol=1e-5, atol=1e-5)
        client.unregister_system_shared_memory(in_name)
        assert [r["name"] for r in client.get_system_shared_memory_status()] == [out_name]
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status() == []
    finally:
        client.close()


async def _post(client: Any, path: str, document: Mapping[str, Any]) -> tuple[int, str]:
    response = await client.post(path, json=document)
    return response.status, (await response.json()).get("error", "") if response.status != 200 else ""


def _shm_request(region: str, byte_size: int, offset: int = 0, shape: tuple[int, ...] = (ROWS, FEATURES),
                 outputs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    params = {"shared_memory_region": region, "shared_memory_byte_size": byte_size}
    if offset:
        params["shared_memory_offset"] = offset
    document: dict[str, Any] = {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(shape),
                                            "parameters": params}]}
    if outputs is not None:
        document["outputs"] = outputs
    return document


async def test_every_shared_memory_mistake_is_a_400_naming_the_region_and_numbers(
        client: Any, regions: Any) -> None:
    size = ROWS * FEATURES * 4
    name, key, handle = regions(size)
    register = f"/v2/systemsharedmemory/region/{name}/register"
    cases = [
        ("/v2/systemsharedmemory/region/esc/register", {"key": "/../etc/passwd", "byte_size": 8},
         ["'esc'", "/../etc/passwd", "POSIX shm name"]),
        ("/v2/systemsharedmemory/region/dots/register", {"key": "..", "byte_size": 8}, ["'dots'", "POSIX"]),
        ("/v2/systemsharedmemory/region/nokey/register", {"key": "/er-absent-key", "byte_size": 8},
         ["'nokey'", "/er-absent-key", "cannot open"]),
        (register, {"key": key, "offset": 16, "byte_size": size}, [f"'{name}'", "offset 16", f"byte_size {size}",
                                                                   f"{size + 16}", f"({size} bytes)"]),
        (register, {"key": key, "byte_size": -1}, [f"'{name}'", "byte_size", "-1"]),
        (register, {"key": key, "offset": "0", "byte_size": 8}, [f"'{name}'", "offset", "'0'"]),
    ]
    for path, document, needles in cases:
        status, error = await _post(client, path, document)
        assert status == 400 and all(n in error for n in needles), (path, document, error)

    assert (await _post(client, register, {"key": key, "byte_size": size}))[0] == 200
    status, error = await _post(client, register, {"key": key, "byte_size": size})
    assert status == 400 and f"'{name}'" in error and "already registered" in error

    infer = "/v2/models/mlp/versions/1/infer"
    inference_cases = [
        (_shm_request("er-unknown", size), ["'er-unknown'", "not registered", name]),
        (_shm_request(name, size, offset=4), [f"'{name}'", "shared_memory_offset 4", f"{size + 4}",
                                              f"({size} bytes)"]),
        (_shm_request(name, size - 4), [f"'{name}'", f"needs {size} bytes", f"{size - 4}"]),
        (_shm_request(name, size, outputs=[{"name": "logits", "parameters": {
            "shared_memory_region": name, "shared_memory_byte_size": 8}}]),
         [f"'{name}'", f"needs {ROWS * CLASSES * 4} bytes", "shared_memory_byte_size 8"]),
    ]
    for document, needles in inference_cases:
        status, error = await _post(client, infer, document)
        assert status == 400 and all(n in error for n in needles), (document, error)
    # The failed requests released their leases: the region unregisters.
    status, error = await _post(client, "/v2/systemsharedmemory/region/er-unknown/unregister", {})
    assert status == 400 and "'er-unknown'" in error
    assert (await _post(client, f"/v2/systemsharedmemory/region/{name}/unregister", {}))[0] == 200
    status = await client.get(f"/v2/systemsharedmemory/region/{name}/status")
    assert status.status == 400 and name in (await status.json())["error"]


@dataclass(frozen=True)
class GatedPlan:
    """Runs only once ``gate`` opens; sets ``entered`` first, so a test knows a request is running."""

    name: str
    backends: tuple[str, ...]
    inner: Any
    entered: threading.Event
    gate: threading.Event

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.entered.set()
        if not self.gate.wait(30):
            raise TimeoutError("the test never opened the gate")
        return self.inner.run(feeds)


async def test_a_region_in_use_by_a_running_request_cannot_be_unregistered(
        aiohttp_client: Any, make_app: Any, tmp_path: Path, regions: Any) -> None:
    from edge_runtime.model_zoo import build_mlp
    from edge_runtime.scheduler import model_plans

    root = tmp_path / "repository"
    write(root / "gated" / "1" / "model.onnx", build_mlp(seed=1))
    (root / "gated" / "config.toml").write_text('[serving]\nbackend = "cpu"\n')
    entered, gate = threading.Event(), threading.Event()

    def gated(model: Any) -> dict[str, Any]:
        return {n: GatedPlan(p.name, p.backends, p, entered, gate) for n, p in model_plans(model).items()}

    client = await aiohttp_client(make_app(root=root, extra_plans=gated))
    x = np.random.default_rng(5).standard_normal((ROWS, FEATURES)).astype(np.float32)
    name, key, handle = regions(x.nbytes)
    shm.set_shared_memory_region(handle, [x])
    assert (await _post(client, f"/v2/systemsharedmemory/region/{name}/register",
                        {"key": key, "byte_size": x.nbytes}))[0] == 200
    running = asyncio.ensure_future(client.post("/v2/models/gated/infer", json=_shm_request(name, x.nbytes)))
    try:
        assert await asyncio.to_thread(entered.wait, 30)
        for path in (f"/v2/systemsharedmemory/region/{name}/unregister", "/v2/systemsharedmemory/unregister"):
            status, error = await _post(client, path, {})
            assert status == 400 and f"'{name}': 1" in error and "in use" in error, error
    finally:
        gate.set()
    response = await running
    assert response.status == 200
    expected = codec.encode_request({"input": x}, binary=False).body
    plain = await (await client.post("/v2/models/gated/infer", data=expected)).json()
    assert (await response.json())["outputs"][0]["data"] == plain["outputs"][0]["data"]
    assert (await _post(client, f"/v2/systemsharedmemory/region/{name}/unregister", {}))[0] == 200
