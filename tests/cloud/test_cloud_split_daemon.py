"""A real edge daemon configured to split sends the tail to its cloud peer, whatever runs the head.

Both sides are ``python -m edge_runtime serve`` processes, as an operator runs them: the peer
A serves the CNN's tail (with a token); the edge daemon B reads a server config with a
``[cloud]`` url and the model's ``[cloud] mode = "split"``. B's model is served on its default
configuration (no backend pinned: ``auto`` measures its candidates, PoCL among them) and with the
OpenCL backend pinned (the head's model on the accelerator). Oracles: ONNX Runtime on the whole
model, B's response parameters (``ran_on``), and A's own success counter for the tail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from cloud_fixtures import ROOT, TOKEN, ServerProcess, build_cnn, cnn_feeds, free_port, ort_outputs, write_model
from edge_runtime.protocol import codec

REQUESTS = 6
READY_S = 600  # the plan race compiles PoCL kernels in its child: minutes on a loaded 2-core box


def _peer_tail_successes(peer: ServerProcess) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    request = urllib.request.Request(f"{peer.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "nv_inference_request_success" and s.labels.get("model") == "cnn_tail")


def _wait_ready(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"edge daemon not ready within {READY_S} s: {log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def tail_peer(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    from edge_runtime.cloud.split import ModelCutter

    root = tmp_path_factory.mktemp("split-peer")
    cutter = ModelCutter(build_cnn())
    write_model(root / "repository", "cnn_tail", cutter.extract(cutter.resolve("pool1"))[1])
    peer = ServerProcess.start(root / "repository", root / "peer.log", timeout_s=READY_S,
                               env={"EDGE_RUNTIME_TOKEN": TOKEN, "EDGE_RUNTIME_CACHE": str(root / "cache")})
    yield peer
    peer.stop()


@pytest.mark.requires_opencl
@pytest.mark.parametrize("serving", ["", '[serving]\nbackend = "opencl"\n'], ids=["default", "opencl"])
def test_an_edge_daemon_configured_to_split_sends_the_tail_to_the_peer(tail_peer: ServerProcess, tmp_path: Path,
                                                                       serving: str) -> None:
    repository = tmp_path / "repository"
    write_model(repository, "cnn", build_cnn())
    (repository / "cnn" / "config.toml").write_text(
        serving + '[cloud]\nmode = "split"\nremote_model = "cnn_tail"\nsplit_at = "pool1"\n')
    port = free_port()
    config = tmp_path / "edge.toml"
    config.write_text(f'[server]\nport = {port}\n[cloud]\nurl = "{tail_peer.url}"\ntoken_env = "PEER_TOKEN"\n')
    env = {**os.environ, "EDGE_RUNTIME_CACHE": str(tmp_path / "cache"), "PEER_TOKEN": TOKEN,
           "PYTHONPATH": str(ROOT)}
    env.pop("EDGE_RUNTIME_BACKENDS", None)
    log = tmp_path / "edge.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "edge_runtime", "serve", "--config", str(config),
                                    "--model-repository", str(repository)],
                                   cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process, log)
        before = _peer_tail_successes(tail_peer)
        for seed in range(REQUESTS):
            feeds = cnn_feeds(seed)
            request = urllib.request.Request(f"{url}/v2/models/cnn/infer", data=codec.encode_request(feeds).body,
                                             method="POST")
            with urllib.request.urlopen(request, timeout=60) as response:
                document = json.loads(response.read())
            assert document["parameters"]["ran_on"] == "split", (document["parameters"], log.read_text()[-2000:])
            for output in document["outputs"]:
                expected = ort_outputs(build_cnn(), feeds)[output["name"]]
                np.testing.assert_allclose(np.asarray(output["data"], np.float32).reshape(output["shape"]),
                                           expected, rtol=1e-4, atol=1e-5)
        assert _peer_tail_successes(tail_peer) - before == REQUESTS
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
