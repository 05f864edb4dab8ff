"""``python -m edge_runtime serve`` as a real process: serves, and on SIGTERM drains then exits 0."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edge_runtime.model_zoo import build_mobilenet
from edge_runtime.protocol import codec
from server_fixtures import ROOT, free_port, ort_run, write

REQUESTS = 8
BATCH = 256  # ~0.1 s of CPU per request: a queue that takes a while to drain


def start_server(repository: Path, cache: Path, port: int, *more: str) -> subprocess.Popen:
    env = {**os.environ, "EDGE_RUNTIME_CACHE": str(cache), "PYTHONPATH": str(ROOT), "EDGE_RUNTIME_THREADS": "1"}
    command = [sys.executable, "-m", "edge_runtime", "--log-level", "INFO", "serve", "--port", str(port),
               "--model-repository", str(repository), *more]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)



@contextlib.contextmanager
def serving(repository: Path, cache: Path, port: int, *more: str) -> Iterator[subprocess.Popen]:
    """``start_server``, killed on the way out unless the test ended it."""
    process = start_server(repository, cache, port, *more)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

async def wait_ready(session: aiohttp.ClientSession, base: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        try:
            async with session.get(f"{base}/v2/health/ready") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError("server not ready within 120 s")


async def all_accepted(session: aiohttp.ClientSession, base: str, in_flight: list[Any]) -> None:
    """Wait until every request is queued, running (one) or answered, and several still wait: only
    requests the server has accepted are promised a drain."""
    deadline = time.monotonic() + 60
    while True:
        queued, answered = await pending(session, base), sum(t.done() for t in in_flight)
        if queued + answered + 1 >= len(in_flight) and queued >= 2:
            return
        assert time.monotonic() < deadline, f"requests never queued up ({queued} queued, {answered} done)"
        await asyncio.sleep(0.01)


async def pending(session: aiohttp.ClientSession, base: str) -> float:
    async with session.get(f"{base}/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        if family.name == "nv_inference_pending_request_count":
            return sum(s.value for s in family.samples)
    return 0.0


async def test_sigterm_drains_in_flight_requests_and_exits_0(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    write(repository / "mobilenet" / "1" / "model.onnx", build_mobilenet())
    (repository / "mobilenet" / "config.toml").write_text('[serving]\nbackend = "cpu"\n')
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = start_server(repository, tmp_path / "cache", port)
    images = [np.random.default_rng(i).standard_normal((BATCH, 3, 64, 64)).astype(np.float32) for i in range(2)]
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            await wait_ready(session, base, process)

            async def infer(i: int) -> tuple[int, bytes, str | None]:
                encoded = codec.encode_request({"input": images[i % 2]}, binary=True,
                                               parameters={"binary_data_output": True})
                async with session.post(f"{base}/v2/models/mobilenet/infer", data=encoded.body, headers={
                        "Inference-Header-Content-Length": str(encoded.header_length)}) as response:
                    return (response.status, await response.read(),
                            response.headers.get("Inference-Header-Content-Length"))

            in_flight = [asyncio.ensure_future(infer(i)) for i in range(REQUESTS)]
            await all_accepted(session, base, in_flight)
            process.send_signal(signal.SIGTERM)
            refused_while_draining = False
            for _ in range(200):
                try:
                    async with aiohttp.ClientSession() as fresh:  # a new connection, not a pooled one
                        async with fresh.get(f"{base}/v2/health/live"):
                            pass
                except aiohttp.ClientConnectionError:
                    refused_while_draining = process.poll() is None
                    break
                await asyncio.sleep(0.01)
            results = await asyncio.gather(*in_flight)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert refused_while_draining, "new connections must be refused while in-flight requests drain"
    assert [status for status, _, _ in results] == [200] * REQUESTS
    assert "draining" in stderr and "Traceback" not in stderr
    expected = ort_run(repository / "mobilenet" / "1" / "model.onnx", {"input": images[0]})["probabilities"]
    _, body, header_length = results[0]
    got = np.frombuffer(body[int(header_length):], "<f4").reshape(BATCH, 10)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)


async def test_sigterm_drains_in_flight_grpc_calls_and_refuses_new_ones(tmp_path: Path) -> None:
    """gRPC beside HTTP drains as HTTP does: calls in flight at SIGTERM are answered, a new call is
    refused (the service stops taking calls at once), and the daemon exits 0."""
    import tritonclient.grpc.aio as agrpc

    repository = tmp_path / "repository"
    write(repository / "mobilenet" / "1" / "model.onnx", build_mobilenet())
    (repository / "mobilenet" / "config.toml").write_text('[serving]\nbackend = "cpu"\n')
    port, grpc_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    images = [np.random.default_rng(i).standard_normal((BATCH, 3, 64, 64)).astype(np.float32) for i in range(2)]
    with serving(repository, tmp_path / "cache", port, "--grpc-port", str(grpc_port)) as process:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            await wait_ready(session, base, process)
            client = agrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")

            async def infer(i: int) -> np.ndarray:
                item = agrpc.InferInput("input", [BATCH, 3, 64, 64], "FP32")
                item.set_data_from_numpy(images[i % 2])
                return (await client.infer("mobilenet", [item])).as_numpy("probabilities")

            in_flight = [asyncio.ensure_future(infer(i)) for i in range(REQUESTS)]
            await all_accepted(session, base, in_flight)
            process.send_signal(signal.SIGTERM)
            refused_while_draining = False
            for _ in range(500):
                await asyncio.sleep(0.01)
                try:
                    await client.is_server_live()
                except Exception:  # the call is refused once the service stops taking calls
                    refused_while_draining = not all(t.done() for t in in_flight)
                    break
            results = await asyncio.gather(*in_flight)
            await client.close()
        _, stderr = await asyncio.to_thread(process.communicate, timeout=60)
    assert process.returncode == 0, stderr
    assert refused_while_draining, "new gRPC calls must be refused while the accepted ones drain"
    expected = ort_run(repository / "mobilenet" / "1" / "model.onnx", {"input": images[0]})["probabilities"]
    np.testing.assert_allclose(results[0], expected, rtol=1e-4, atol=1e-6)
    assert len(results) == REQUESTS and "Traceback" not in stderr


@pytest.mark.aarch64
def test_the_daemon_process_answers_tritonclient_like_onnxruntime(tmp_path: Path) -> None:
    """``edge-runtime serve`` as a process, the reference client, small inputs (runs emulated too)."""
    import tritonclient.http as triton

    from edge_runtime.model_zoo import build_mlp
    from server_fixtures import triton_inputs

    repository = tmp_path / "repository"
    write(repository / "mlp" / "1" / "model.onnx", build_mlp(seed=2))
    (repository / "mlp" / "config.toml").write_text('[serving]\nbackend = "cpu"\n')
    port = free_port()
    with serving(repository, tmp_path / "cache", port) as process:
        client = triton.InferenceServerClient(f"127.0.0.1:{port}", connection_timeout=30, network_timeout=120)
        _wait_ready(client, process, 240)  # an emulated arm64 interpreter takes a while to import
        x = np.random.default_rng(8).standard_normal((3, 64)).astype(np.float32)
        for binary in (False, True):
            outputs = [triton.InferRequestedOutput("logits", binary_data=binary)]
            result = client.infer("mlp", triton_inputs({"input": x}, binary), outputs=outputs)
            expected = ort_run(repository / "mlp" / "1" / "model.onnx", {"input": x})["logits"]
            np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=1e-5, atol=1e-6)
        client.close()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr


def test_the_daemon_serves_grpc_beside_http_when_asked(tmp_path: Path) -> None:
    """``serve --grpc-port``: tritonclient.grpc gets ONNX Runtime's answer, the log names both ports, and
    SIGTERM still exits 0."""
    import tritonclient.grpc as tgrpc

    from edge_runtime.model_zoo import build_mlp

    repository = tmp_path / "repository"
    write(repository / "mlp" / "1" / "model.onnx", build_mlp(seed=2))
    (repository / "mlp" / "config.toml").write_text('[serving]\nbackend = "cpu"\n')
    port, grpc_port = free_port(), free_port()
    with serving(repository, tmp_path / "cache", port, "--grpc-port", str(grpc_port)) as process:
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        _wait_ready(client, process, 120)
        x = np.random.default_rng(9).standard_normal((2, 64)).astype(np.float32)
        item = tgrpc.InferInput("input", [2, 64], "FP32")
        item.set_data_from_numpy(x)
        got = client.infer("mlp", [item]).as_numpy("logits")
        np.testing.assert_allclose(got, ort_run(repository / "mlp" / "1" / "model.onnx", {"input": x})["logits"],
                                   rtol=1e-5, atol=1e-6)
        client.close()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert f"and gRPC 127.0.0.1:{grpc_port}" in stderr and "Traceback" not in stderr


def _wait_ready(client: object, process: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not _ready(client):
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, f"server not ready within {seconds:g} s"
        time.sleep(0.2)


def _ready(client: object) -> bool:
    from tritonclient.utils import InferenceServerException

    try:
        return client.is_server_ready()
    except (InferenceServerException, ConnectionError, OSError):
        return False

def run_serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGE_RUNTIME_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "edge_runtime", "serve", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_port_in_use_exits_1_naming_the_address(tmp_path: Path) -> None:
    from edge_runtime.model_zoo import build_mlp

    write(tmp_path / "repository" / "mlp" / "1" / "model.onnx", build_mlp())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_serve(tmp_path, "--port", str(port), "--model-repository", str(tmp_path / "repository"))
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.aarch64
def test_missing_repository_is_refused_before_start(tmp_path: Path) -> None:
    result = run_serve(tmp_path, "--model-repository", str(tmp_path / "nowhere"))
    assert result.returncode == 1
    assert "nowhere is not a directory" in result.stderr and "Traceback" not in result.stderr
