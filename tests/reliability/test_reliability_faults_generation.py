"""Faults of the generation cloud path: the OpenAI-compatible peer (a second edge-runtime daemon serving
the same tiny decoder) slow, resetting connections, or SIGKILLed — before and after its first token.

The edge (the real app, in process) serves ``always`` (``[cloud] mode = "always"``) and ``local``
(the same weights, no cloud): greedy output is the same tokens on either side, so ``local`` is the
oracle of every answer. The peer is reached through the shaping proxy (``tools/netem_proxy.py``).

* Before the first token (``GenerationRouter``: the request still fits here): answered locally,
  streamed or not, with the local greedy answer; the cloud call is counted as failed.
* After the first token a streamed answer cannot start over: the stream ends cleanly — the tokens
  already sent (a prefix of the local answer), one error event in the route's error shape naming
  the cloud failure (on the Responses API its ``response.failed`` event), ``[DONE]`` on the chat
  route, the HTTP body properly terminated, no truncated chunk. A non-streamed request gets a 502 naming the failure (no byte had been sent,
  but the router does not restart a request that got tokens from the cloud).

"Killed" is a real SIGKILL of the peer process. So that the kill lands mid-answer on any machine
speed, the proxy holds the rest of the answer (``stall_after_bytes``) until the kill's close comes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from reliability_fixtures import Daemon, assert_names_the_problem, generation_config, read_sse

MAX_TOKENS = 40
PROMPT = "open the settings menu then scroll down"
EDGE_GENERATION = generation_config(max_batch_size=2, max_queue=8, max_seq_len=256)
FIRST_TOKENS_BYTES = 1200  # the peer's headers, its role event and the first content events (each ~240 B)
WAIT_LIMIT_S = 60.0  # bounds the waits on the server; never an assertion on speed


@pytest.fixture(scope="module")
def repositories(tmp_path_factory: pytest.TempPathFactory, tiny_decoder: Path) -> tuple[Path, Path, Path]:
    base = tmp_path_factory.mktemp("generation_faults")
    peer, edge = base / "peer", base / "edge"
    shutil.copytree(tiny_decoder, peer / "chat" / "1")
    (peer / "chat" / "config.toml").write_text(EDGE_GENERATION)
    for name, cloud in (("always", '[cloud]\nmode = "always"\nremote_model = "chat"\n'), ("local", "")):
        shutil.copytree(tiny_decoder, edge / name / "1")
        (edge / name / "config.toml").write_text(EDGE_GENERATION + cloud)
    return base, peer, edge


@pytest.fixture(scope="module")
def peer(repositories: tuple[Path, Path, Path]) -> Any:
    base, peer_repo, _ = repositories
    daemon = Daemon.start(peer_repo, base / "peer-cache", base / "peer.log")
    yield daemon
    assert daemon.stop() == 0, daemon.log()[-3000:]


@pytest.fixture
def own_peer(repositories: tuple[Path, Path, Path], tmp_path: Path) -> Any:
    """A peer of this test alone (it gets killed)."""
    _, peer_repo, _ = repositories
    daemon = Daemon.start(peer_repo, tmp_path / "cache", tmp_path / "peer.log")
    yield daemon
    daemon.stop()


def _cloud(url: str, **changes: Any) -> Any:
    from edge_runtime.cloud.config import CloudConfig

    # A breaker that never opens here: every request of a test really calls the peer.
    return dataclasses.replace(CloudConfig(url=url, timeout_ms=10_000, breaker_failures=1000), **changes)


ROUTES = {  # name -> (path, streamed)
    "chat_stream": ("/v1/chat/completions", True),
    "chat": ("/v1/chat/completions", False),
    "responses_stream": ("/v1/responses", True),
    "generate_stream": ("/v2/models/{model}/generate_stream", True),
    "generate": ("/v2/models/{model}/generate", False),
}


def _request(route: str, model: str) -> tuple[str, dict[str, Any]]:
    path, stream = ROUTES.get(route, ("/v1/responses", False))
    if path == "/v1/responses":
        return path, {"model": model, "input": PROMPT, "max_output_tokens": MAX_TOKENS, "temperature": 0,
                      "stream": stream}
    if path.startswith("/v1/"):
        return path, {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS,
                      "temperature": 0, "stream": stream}
    return path.format(model=model), {"text_input": PROMPT, "parameters": {"max_tokens": MAX_TOKENS,
                                                                           "temperature": 0}}


async def _answer(client: Any, route: str, model: str) -> tuple[int, Any]:
    """(status, text or StreamResult or error body) of one request; a hang fails the test."""
    return await asyncio.wait_for(_one(client, route, model), WAIT_LIMIT_S)


async def _one(client: Any, route: str, model: str) -> tuple[int, Any]:
    path, body = _request(route, model)
    response = await client.post(path, json=body)
    if response.status == 200 and ROUTES.get(route, ("", False))[1]:
        return 200, await read_sse(response)
    document = await response.json()
    if response.status != 200:
        return response.status, document
    if route == "responses":
        return 200, "".join(part["text"] for item in document["output"] if item["type"] == "message"
                            for part in item["content"])
    return 200, (document["choices"][0]["message"]["content"] if route == "chat" else document["text_output"])


async def _local(client: Any, route: str) -> str:
    """The oracle: the same request to the cloud-less model with the same weights."""
    status, answer = await _answer(client, route.removesuffix("_stream"), "local")
    assert status == 200, answer
    return answer


async def _cloud_calls(client: Any) -> dict[str, float]:
    text = await (await client.get("/metrics")).text()
    return {outcome: float(value) for outcome, value in
            re.findall(r'edge_runtime_cloud_calls_total\{model="always",outcome="(\w+)"\} (\S+)', text)}


async def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.005)


async def _with_kill(answering: Any, victim: Daemon, when: Any) -> Any:
    """Run ``answering``; SIGKILL ``victim`` (by its PID) as soon as ``when()`` holds."""
    task = asyncio.ensure_future(answering)
    await _until(lambda: when() or task.done(), "the moment to kill the peer")
    assert not task.done(), "the request ended before the peer could be killed"
    os.kill(victim.process.pid, signal.SIGKILL)
    return await task


@pytest.mark.parametrize("route", ["chat_stream", "chat"])
@pytest.mark.parametrize("link", ["slow", "reset", "killed"])
async def test_a_cloud_failure_before_the_first_token_is_answered_locally(
        aiohttp_client: Any, make_rel_app: Any, repositories: Any, request: pytest.FixtureRequest,
        link: str, route: str) -> None:
    from netem_proxy import LinkProfile, ShapingProxy

    _, _, edge_repo = repositories
    target = request.getfixturevalue("own_peer" if link == "killed" else "peer")
    profile = {"slow": LinkProfile("slow", delay_ms=400),  # the first byte comes after the 300 ms timeout
               "reset": LinkProfile("reset", reset_after_bytes=64),  # inside the answer's status line/headers
               "killed": LinkProfile("hold", delay_ms=1000)}[link]  # the request waits in the link; the peer dies
    with ShapingProxy("127.0.0.1", target.port, profile) as proxy:
        timeout_ms = 300 if link == "slow" else 10_000
        client = await aiohttp_client(make_rel_app(edge_repo, cloud=_cloud(f"http://127.0.0.1:{proxy.port}",
                                                                             timeout_ms=timeout_ms)))
        expected = await _local(client, route)
        answering = _answer(client, route, "always")
        if link == "killed":
            status, answer = await _with_kill(answering, target, lambda: proxy.connections > 0)
        else:
            status, answer = await answering
    assert status == 200, answer
    if route == "chat_stream":
        assert answer.done and answer.error is None and not answer.cut and not answer.truncated, answer
        answer = answer.text
    assert answer == expected
    calls = await _cloud_calls(client)
    assert calls.get("ok", 0) == 0 and sum(calls.values()) >= 1, calls  # it was tried, failed, and said so
    assert (await client.get("/v2/health/ready")).status == 200


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("link", ["reset", "stalled", "killed"])
async def test_a_cloud_failure_after_the_first_token_ends_the_answer_cleanly(
        aiohttp_client: Any, make_rel_app: Any, repositories: Any, request: pytest.FixtureRequest,
        link: str, route: str) -> None:
    from netem_proxy import LinkProfile, ShapingProxy

    _, _, edge_repo = repositories
    target = request.getfixturevalue("own_peer" if link == "killed" else "peer")
    profile = {"reset": LinkProfile("reset", reset_after_bytes=FIRST_TOKENS_BYTES),
               "stalled": LinkProfile("stalled", stall_after_bytes=FIRST_TOKENS_BYTES),  # then the timeout
               "killed": LinkProfile("held", stall_after_bytes=FIRST_TOKENS_BYTES)}[link]  # then SIGKILL
    with ShapingProxy("127.0.0.1", target.port, profile) as proxy:
        timeout_ms = 1500 if link == "stalled" else 30_000
        client = await aiohttp_client(make_rel_app(edge_repo, cloud=_cloud(f"http://127.0.0.1:{proxy.port}",
                                                                             timeout_ms=timeout_ms)))
        expected = await _local(client, route)
        answering = _answer(client, route, "always")
        if link == "killed":
            status, answer = await _with_kill(answering, target, lambda: proxy.stalls > 0)
        else:
            status, answer = await answering
    # The premise: the local answer is longer than what passed the link before it failed.
    assert len(expected) > 10, expected
    v1, responses = route.startswith(("chat", "responses")), route.startswith("responses")
    if ROUTES[route][1]:
        assert status == 200
        assert not answer.cut and not answer.truncated and answer.after_done == 0, answer
        # [DONE] ends the chat stream; Triton's generate_stream and the Responses API have none
        assert answer.done is (v1 and not responses)
        assert answer.text and expected.startswith(answer.text) and answer.text != expected, (answer.text, expected)
        message = answer.error["message"] if v1 else answer.error
        assert isinstance(message, str) and "cloud" in message, answer.events[-1]
        if responses:  # the Response's own terminal event, with what was said so far
            last = answer.events[-1]
            assert last["type"] == "response.failed" and answer.error["code"] == "server_error", last
            said = [part["text"] for item in last["response"]["output"] for part in item.get("content", [])]
            assert "".join(said) == answer.text and last["response"]["status"] == "failed", last
            assert [e["sequence_number"] for e in answer.events] == list(range(len(answer.events)))
        elif v1:
            assert answer.error["type"] == "server_error"
        assert answer.finish_reason is None  # never claimed to have finished
    else:
        assert status == 502, answer
        assert_names_the_problem(status, json.dumps(answer).encode(), route)
        assert "cloud" in (answer["error"]["message"] if v1 else answer["error"])
    calls = await _cloud_calls(client)
    assert calls.get("ok", 0) == 0 and sum(calls.values()) >= 1, calls
    if link == "stalled":
        assert any("Timeout" in outcome for outcome in calls), calls
    elif link == "killed":
        assert not any("Timeout" in outcome for outcome in calls), calls  # the kill ended it, not the clock
    # The edge is fine: the local model answers, and the same request to it streams to the end.
    assert (await client.get("/v2/health/ready")).status == 200
    status, again = await _answer(client, route, "local")
    assert status == 200 and (again.text if ROUTES[route][1] else again) == expected
