"""SIGTERM under load: what the daemon accepted it answers, then it exits 0; nothing is lost.

Clients keep sending JSON and binary inferences, each on a new connection,
while the daemon gets SIGTERM. Every request ends one of two ways: a 200 with
the ONNX Runtime answer, or refused before the server took it (connection
refused, or a connection accepted but not yet read closed without an answer, as
HTTP/1.1 lets a server close idle connections) — never a 5xx, never a wrong
answer. "Nothing lost": the daemon's access log lists exactly as many answered
inferences as the clients received (no answer computed and then dropped).

With generation in the mix (the tiny decoder beside the tensor model): chat
streams, non-streamed chats and Triton ``generate_stream`` calls keep coming,
and the signal lands while a long stream is running. Every stream the daemon
accepted finishes (``[DONE]``, or the finishing event on ``generate_stream``)
with its no-load greedy answer, no chunk cut in half; the access log's 200s per
route equal the answers the clients received whole. A stream longer than the
drain timeout is cut at an event boundary, never inside a JSON chunk, and is
not logged as answered.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import onnx

from edge_runtime.protocol import codec
from reliability_fixtures import Daemon, generation_config, read_sse
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


# -- with generation ------------------------------------------------------------------------------
PROMPTS = ["open the settings menu", "scroll down to the bottom", "tap the blue button twice"]
SHORT_TOKENS = 24
LONG_TOKENS = 1000  # the stream the signal lands in (ignore_eos: exactly this many)
CUT_TOKENS = 1500  # ~1 s on two cores: longer than a 0.5 s drain
STREAMS_BEFORE_SIGNAL = 4
LONG_EVENTS_AT_SIGNAL = 10
REFUSED = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


def _chat(prompt: str, max_tokens: int, stream: bool, **more: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream, **more}


def _generate(prompt: str) -> dict[str, Any]:
    return {"text_input": prompt, "parameters": {"max_tokens": SHORT_TOKENS, "temperature": 0}}


def _start_with_chat(tmp_path: Path, tiny_decoder: Path, drain_timeout_s: float, max_seq_len: int,
                     heavy: bool = True) -> Daemon:
    from cloud_fixtures import build_heavy

    repository = tmp_path / "repository"
    shutil.copytree(tiny_decoder, repository / "chat" / "1")
    (repository / "chat" / "config.toml").write_text(
        generation_config(max_batch_size=4, max_queue=16, max_seq_len=max_seq_len))
    if heavy:
        (repository / "heavy" / "1").mkdir(parents=True)
        onnx.save(build_heavy(), str(repository / "heavy" / "1" / "model.onnx"))
        (repository / "heavy" / "config.toml").write_text('[serving]\nbackend = "cpu"\n')
    (tmp_path / "serve.toml").write_text(f"[server]\ndrain_timeout_s = {drain_timeout_s}\n")
    return Daemon.start(repository, tmp_path / "cache", tmp_path / "serve.log", config=tmp_path / "serve.toml")


async def _no_load(session: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any]) -> str:
    async with session.post(f"{url}{path}", json=body) as response:
        assert response.status == 200, await response.text()
        document = await response.json()
    return document["text_output"] if "text_output" in document else document["choices"][0]["message"]["content"]


def _logged_200(log: str, path: str) -> int:
    return len(re.findall(rf'"POST {re.escape(path)} HTTP/1\.1" 200 ', log))


async def test_sigterm_with_running_streams_finishes_every_accepted_stream(tmp_path: Path,
                                                                           tiny_decoder: Path) -> None:
    daemon = _start_with_chat(tmp_path, tiny_decoder, drain_timeout_s=30.0, max_seq_len=2048)
    x = np.random.default_rng(0).standard_normal((1, 64, 256)).astype(np.float32)
    expected_y = ort_run(tmp_path / "repository" / "heavy" / "1" / "model.onnx", {"x": x})["y"]
    url = daemon.url
    counts = {"infer": 0, "chat": 0, "chat_stream": 0, "generate_stream": 0}  # answers received whole
    refused: list[str] = []
    signalled = asyncio.Event()
    long_events_after_signal = 0
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            chat_expected = {p: await _no_load(session, url, "/v1/chat/completions", _chat(p, SHORT_TOKENS, False))
                             for p in PROMPTS}
            generate_expected = {p: await _no_load(session, url, "/v2/models/chat/generate", _generate(p))
                                 for p in PROMPTS}
            long_body = _chat(PROMPTS[0], LONG_TOKENS, True, ignore_eos=True)
            long_expected = await _no_load(session, url, "/v1/chat/completions", {**long_body, "stream": False})
            # the no-load answers above were logged as 200 too
            baseline = {"chat": len(PROMPTS) + 1, "generate_stream": 0}

        async def one(kind: str, i: int, session: aiohttp.ClientSession) -> None:
            prompt = PROMPTS[i % len(PROMPTS)]
            if kind == "infer":
                async with session.post(f"{url}/v2/models/heavy/infer",
                                        data=codec.encode_request({"x": x}).body) as response:
                    assert response.status == 200, (response.status, await response.read())
                    (output,) = (await response.json())["outputs"]
                np.testing.assert_allclose(np.array(output["data"], np.float32).reshape(output["shape"]),
                                           expected_y, rtol=1e-4, atol=1e-5)
            elif kind == "chat":
                text = await _no_load(session, url, "/v1/chat/completions", _chat(prompt, SHORT_TOKENS, False))
                assert text == chat_expected[prompt]
            else:
                path = "/v1/chat/completions" if kind == "chat_stream" else "/v2/models/chat/generate_stream"
                body = _chat(prompt, SHORT_TOKENS, True) if kind == "chat_stream" else _generate(prompt)
                async with session.post(f"{url}{path}", json=body) as response:
                    assert response.status == 200, (response.status, await response.read())
                    result = await read_sse(response)
                assert not result.cut and not result.truncated and result.error is None, (kind, result)
                assert result.done if kind == "chat_stream" else result.finish_reason, (kind, result)
                want = chat_expected if kind == "chat_stream" else generate_expected
                assert result.text == want[prompt], (kind, result.text)
            counts[kind] += 1

        async def client(kind: str, k: int) -> None:
            connector = aiohttp.TCPConnector(force_close=True)  # a new connection per request
            async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
                for i in range(k, k + MAX_PER_CLIENT):
                    try:
                        await one(kind, i, session)
                    except REFUSED as exc:
                        assert signalled.is_set(), f"{kind} refused before any signal: {exc!r}"
                        refused.append(kind)
                        return

        async def long_stream_then_signal() -> Any:
            deadline = time.monotonic() + 120
            while (counts["infer"] < ANSWERED_BEFORE_SIGNAL or counts["chat_stream"] < STREAMS_BEFORE_SIGNAL
                   or not counts["chat"] or not counts["generate_stream"]):
                assert time.monotonic() < deadline and daemon.process.poll() is None, daemon.log()[-2000:]
                await asyncio.sleep(0.01)
            events = 0

            def on_event(event: Any) -> None:
                nonlocal events, long_events_after_signal
                events += 1
                long_events_after_signal += signalled.is_set()
                if events == LONG_EVENTS_AT_SIGNAL:  # the signal lands while this stream runs
                    signalled.set()
                    daemon.process.send_signal(signal.SIGTERM)

            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                async with session.post(f"{url}/v1/chat/completions", json=long_body) as response:
                    assert response.status == 200, await response.text()
                    return await read_sse(response, on_event)

        kinds = ["infer", "infer", "chat", "chat_stream", "chat_stream", "generate_stream"]
        long_result, *_ = await asyncio.gather(long_stream_then_signal(),
                                               *(client(kind, k) for k, kind in enumerate(kinds)))
        code = daemon.process.wait(timeout=60)
    finally:
        daemon.stop()
    log = daemon.log()
    assert code == 0 and "Traceback" not in log, log[-3000:]
    assert "draining" in log and refused, counts  # the clients went on until the daemon refused them
    assert long_result.done and not long_result.cut and not long_result.truncated, long_result
    assert long_result.text == long_expected and long_events_after_signal > 0
    assert not re.search(r'"POST [^"]*" 5\d\d ', log), "a 5xx was answered while draining"
    assert _logged_200(log, "/v2/models/heavy/infer") == counts["infer"]
    assert _logged_200(log, "/v1/chat/completions") == baseline["chat"] + counts["chat"] + counts["chat_stream"] + 1
    assert _logged_200(log, "/v2/models/chat/generate_stream") == counts["generate_stream"]
    for prompt in PROMPTS:  # the daemon logged at INFO: no prompt in it
        assert prompt not in log, f"prompt {prompt!r} was logged"


async def test_a_stream_outlasting_the_drain_is_cut_between_events(tmp_path: Path, tiny_decoder: Path) -> None:
    """``drain_timeout_s`` bounds the drain: a stream still running then is cut, at an event boundary."""
    daemon = _start_with_chat(tmp_path, tiny_decoder, drain_timeout_s=0.5, max_seq_len=CUT_TOKENS + 64, heavy=False)
    body = _chat(PROMPTS[1], CUT_TOKENS, True, ignore_eos=True)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            expected = await _no_load(session, daemon.url, "/v1/chat/completions", {**body, "stream": False})
            events = 0

            def on_event(event: Any) -> None:
                nonlocal events
                events += 1
                if events == LONG_EVENTS_AT_SIGNAL:
                    daemon.process.send_signal(signal.SIGTERM)

            async with session.post(f"{daemon.url}/v1/chat/completions", json=body) as response:
                assert response.status == 200
                result = await read_sse(response, on_event)
        code = daemon.process.wait(timeout=60)
    finally:
        daemon.stop()
    log = daemon.log()
    assert code == 0 and "Traceback" not in log, log[-3000:]
    assert not result.truncated and result.after_done == 0, result.truncated[:200]
    assert expected.startswith(result.text) and len(result.events) >= LONG_EVENTS_AT_SIGNAL
    if result.done:  # a fast machine finished it within the drain
        assert result.text == expected and not result.cut
    else:
        assert result.cut and result.finish_reason is None
    assert _logged_200(log, "/v1/chat/completions") == 1 + result.done  # the no-load answer, and this if whole
