"""Shared-memory regions changed under the server's feet, against a real daemon (a crash would end it,
not the test run).

* the owner unlinks the object while it is registered: POSIX keeps the mapping, answers stay right,
  the region unregisters cleanly, registering the gone key again is a 400 naming it;
* the owner shrinks the object while it is registered: reading it must be a clean 4xx, never a
  SIGBUS that ends the daemon;
* keys that are not POSIX shm names (paths, dots, NUL, 300 characters) are refused.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from reliability_fixtures import Daemon, mlp_feeds
from server_fixtures import ort_run

SIZE = 1 << 16


def _start(root: Path) -> tuple[Daemon, Path]:
    from edge_runtime.model_zoo import build_mlp
    from server_fixtures import write

    write(root / "repository" / "mlp" / "1" / "model.onnx", build_mlp(seed=0))
    (root / "repository" / "mlp" / "config.toml").write_text('[serving]\nbackend = "cpu"\n')
    daemon = Daemon.start(root / "repository", root / "cache", root / "serve.log")
    return daemon, root / "repository" / "mlp" / "1" / "model.onnx"


@pytest.fixture(scope="module")
def shm_daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    daemon, model = _start(tmp_path_factory.mktemp("shm"))
    yield daemon, model
    daemon.stop()


@pytest.fixture
def shm_object() -> Any:
    """A POSIX shm object of SIZE bytes (``/dev/shm/<name>``), open read-write; removed after the test."""
    name = f"rel-{uuid.uuid4().hex[:8]}"
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o600)
    os.ftruncate(fd, SIZE)
    yield name, fd
    os.close(fd)
    Path(f"/dev/shm/{name}").unlink(missing_ok=True)


def _infer_from(base: str, region: str, nbytes: int) -> requests.Response:
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                        "parameters": {"shared_memory_region": region, "shared_memory_byte_size": nbytes}}]}
    return requests.post(f"{base}/v2/models/mlp/infer", json=body, timeout=30)


def _register(base: str, region: str, key: str, byte_size: int = SIZE) -> requests.Response:
    return requests.post(f"{base}/v2/systemsharedmemory/region/{region}/register",
                         json={"key": key, "offset": 0, "byte_size": byte_size}, timeout=30)


def test_a_region_unlinked_by_its_owner_keeps_answering_and_unregisters(shm_daemon: Any, shm_object: Any) -> None:
    daemon, model = shm_daemon
    name, fd = shm_object
    x = mlp_feeds(1)["input"]
    os.pwrite(fd, x.tobytes(), 0)
    assert _register(daemon.url, name, f"/{name}").status_code == 200
    os.unlink(f"/dev/shm/{name}")  # the owner is done with the name; the memory lives while mapped
    response = _infer_from(daemon.url, name, x.nbytes)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    np.testing.assert_allclose(np.array(output["data"], np.float32).reshape(output["shape"]),
                               next(iter(ort_run(model, {"input": x}).values())), rtol=1e-5, atol=1e-6)
    assert requests.post(f"{daemon.url}/v2/systemsharedmemory/region/{name}/unregister", timeout=30).status_code == 200
    again = _register(daemon.url, name, f"/{name}")
    assert again.status_code == 400 and name in again.json()["error"]
    assert daemon.process.poll() is None


def test_a_region_shrunk_by_its_owner_is_a_clean_error_not_a_crash(tmp_path: Path, shm_object: Any) -> None:
    daemon, _ = _start(tmp_path)  # its own daemon: if this one dies, the other tests' does not
    name, fd = shm_object
    assert _register(daemon.url, name, f"/{name}").status_code == 200
    try:
        os.ftruncate(fd, 0)  # reading the mapped pages now would raise SIGBUS in the reader
        response = _infer_from(daemon.url, name, 256)
        assert daemon.process.poll() is None, f"the daemon died: {daemon.log()[-2000:]}"
        assert 400 <= response.status_code < 500 and name in response.json()["error"], response.text
    finally:
        daemon.stop()


@pytest.mark.parametrize("key", ["/../etc/passwd", "../x", "/a/b", "..", "/.", "", "/", "a\x00b", "/" + "k" * 300,
                                 " x", "/dev/shm/x", 7, None, ["x"]])
def test_keys_that_are_not_posix_shm_names_are_refused(shm_daemon: Any, key: Any) -> None:
    daemon, _ = shm_daemon
    response = _register(daemon.url, "hostile", key)
    assert response.status_code == 400, (key, response.status_code, response.text)
    assert "key" in response.json()["error"]
