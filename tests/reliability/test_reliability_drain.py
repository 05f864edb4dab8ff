"""SIGTERM under load: what the daemon accepted it answers, then it exits 0; nothing is lost.

Clients keep sending JSON and binary inferences, each on a new connection,
while the daemon gets SIGTERM. Every request ends one of two ways: a 200 with
the ONNX Runtime answer, or refused before the server took it (connection
refused, or a connection accepted but not yet read closed without an answer, as
HTTP/1.1 lets a server close idle connections) — never a 5xx, never a wrong
answer. "Nothing lost": the daemon's access log lists exactly as many answered
inferences as the clients received (no answer computed and then dropped).
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import onnx

from edge_runtime.protocol import codec
from reliability_fixtures import Daemon
from server_fixtures import ort_run

CLIENTS = 6
MAX_PER_CLIENT = 150  # bounded: each client stops at the first refusal or after this many
ANSWERED_BEFORE_SIGNAL = 20


async def test_sigterm_under_load_answers_everything_accepted(tmp_path: Path) -> None:
    from cloud_fixtures import build_heavy

    model_dir = tmp_path / "repository" / "heavy" / "1"
    model_dir.mkdir(parents=True)
    onnx.save(build_heavy(), str(model_dir / "model.onnx"))
    (tmp_path / "repository" / "heavy" / "config.toml").write_text('[serving]\nbackend = "cpu"\n')
    daemon = Daemon.start(tmp_path / "repository", tmp_path / "cache", tmp_path / "serve.log")
    inputs = [np.random.default_rng(i).standard_normal((1, 64, 256)).astype(np.float32) for i in range(3)]
    expected = [ort_run(model_dir / "model.onnx", {"x": x})["y"] for x in inputs]
    outcomes: list[str] = []
    signalled = asyncio.Event()

    async def client(k: int) -> None:
        connector = aiohttp.TCPConnector(force_close=True)  # a new connection per request
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
            for i in range(MAX_PER_CLIENT):
                which = (k + i) % len(inputs)
                binary = (k + i) % 2 == 0
                encoded = codec.encode_request({"x": inputs[which]}, binary=binary,
                                               parameters={"binary_data_output": True} if binary else None)
                headers = {"Inference-Header-Content-Length": str(encoded.header_length)} if binary else {}
                try:
                    async with session.post(f"{daemon.url}/v2/models/heavy/infer", data=encoded.body,
                                            headers=headers) as response:
                        body = await response.read()
                        assert response.status == 200, (response.status, body[:300])
                        if binary:
                            length = int(response.headers["Inference-Header-Content-Length"])
                            y = np.frombuffer(body[length:], "<f4").reshape(expected[which].shape)
                        else:
                            (output,) = (await response.json())["outputs"]
                            y = np.array(output["data"], np.float32).reshape(output["shape"])
                        np.testing.assert_allclose(y, expected[which], rtol=1e-4, atol=1e-5)
                        outcomes.append("answered")
                except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError,
                        aiohttp.ClientOSError) as exc:
                    assert signalled.is_set(), f"refused before any signal: {exc!r}"
                    outcomes.append(f"refused:{type(exc).__name__}")
                    return

    async def terminate() -> None:
        deadline = time.monotonic() + 120
        while outcomes.count("answered") < ANSWERED_BEFORE_SIGNAL:
            assert time.monotonic() < deadline and daemon.process.poll() is None, daemon.log()[-2000:]
            await asyncio.sleep(0.01)
        signalled.set()
        daemon.process.send_signal(signal.SIGTERM)

    try:
        await asyncio.gather(terminate(), *(client(k) for k in range(CLIENTS)))
        code = daemon.process.wait(timeout=60)
    finally:
        daemon.stop()
    log = daemon.log()
    assert code == 0 and "Traceback" not in log, log[-3000:]
    assert "draining" in log
    logged = len(re.findall(r'"POST /v2/models/heavy/infer HTTP/1\.1" 200 ', log))
    answered = outcomes.count("answered")
    assert answered >= ANSWERED_BEFORE_SIGNAL and len(outcomes) > answered, outcomes
    assert logged == answered, f"the daemon answered {logged} inferences, the clients received {answered}"
    assert not re.search(r'"POST [^"]*" 5\d\d ', log), "a 5xx was answered while draining"
    for value in inputs[0].reshape(-1)[:16]:  # the daemon logged at INFO: no tensor value in it
        assert f"{float(value):.6f}" not in log, f"input value {value} was logged"
