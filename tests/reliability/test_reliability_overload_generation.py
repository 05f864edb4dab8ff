"""Overload of a generative model is answered, not absorbed, and running streams keep streaming.

A real daemon serves the tiny decoder with a small ``[generation]`` table (2
rows decoded together, 2 requests waiting). Its capacity is measured first
(greedy chat requests one at a time, whose answers are also the no-load
oracle), then a long stream is started and, once its first token is in,
~10x that capacity is offered open-loop for a bounded time (non-streaming
and streaming chat requests). Asserted:

* the daemon stays up, only 200 and 429 come back, every 429 with Retry-After,
  and a 429 is answered faster (median) than an admitted request;
* every admitted request's greedy answer equals its no-load answer, streams
  with all their chunks and ``[DONE]``;
* the stream started before the flood kept streaming through it (it received
  chunks after the first 429 came back) and ended with its no-load answer;
* rejected requests never ran: the prompt tokens the model prefilled equal the
  prompts of the admitted requests exactly (the prefix cache is off);
* the daemon's RSS stays bounded and it serves normally right after.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from reliability_fixtures import Daemon, generation_config, read_sse

OVERLOAD_FACTOR = 10
PROMPTS = ["open the settings menu", "scroll down to the bottom", "tap the blue button twice",
           "search for the weather"]
NEW_TOKENS = 16  # each flood request
LONG_TOKENS = 900  # the stream running through the flood (ignore_eos: exactly this many)
PROBE_REQUESTS = 12
OVERLOAD_S = 3.0
MAX_REQUESTS = 3000  # bounded in count as well as in time
MAX_IN_FLIGHT = 64
RSS_GROWTH_LIMIT = 256 * 1024 * 1024
CONFIG = generation_config(max_batch_size=2, max_queue=2, max_seq_len=1024)


def _body(prompt: str, stream: bool = False, max_tokens: int = NEW_TOKENS, **more: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream, **more}


def _prefilled(metrics: str) -> int:
    match = re.search(r'edge_runtime_generation_tokens_total\{kind="prefill",model="chat"\} (\S+)', metrics)
    assert match, "no prefill counter in /metrics"
    return int(float(match.group(1)))


@pytest.fixture(scope="module")
def chat_daemon(tmp_path_factory: pytest.TempPathFactory, tiny_decoder: Path) -> Any:
    root = tmp_path_factory.mktemp("overload_generation")
    shutil.copytree(tiny_decoder, root / "repository" / "chat" / "1")
    (root / "repository" / "chat" / "config.toml").write_text(CONFIG)
    daemon = Daemon.start(root / "repository", root / "cache", root / "serve.log")
    yield daemon
    code = daemon.stop()
    log = daemon.log()
    assert code == 0 and "Traceback" not in log, log[-3000:]


async def test_ten_times_capacity_of_generation_is_refused_fast_and_running_streams_keep_streaming(
        chat_daemon: Daemon) -> None:
    import openai

    daemon = chat_daemon
    url = f"{daemon.url}/v1/chat/completions"
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=60)

    # No load: the oracle answers, and the capacity (requests one at a time).
    expected: dict[str, tuple[str, int]] = {}  # prompt -> (greedy text, prompt tokens)
    started = time.perf_counter()
    for i in range(PROBE_REQUESTS):
        prompt = PROMPTS[i % len(PROMPTS)]
        answer = client.chat.completions.create(**_body(prompt))
        got = (answer.choices[0].message.content, answer.usage.prompt_tokens)
        assert expected.setdefault(prompt, got) == got, "greedy answers differ with no load at all"
    capacity_rps = PROBE_REQUESTS / (time.perf_counter() - started)
    long_body = _body(PROMPTS[0], stream=True, max_tokens=LONG_TOKENS, ignore_eos=True)
    long_expected = client.chat.completions.create(**_body(PROMPTS[0], max_tokens=LONG_TOKENS),
                                                   extra_body={"ignore_eos": True}).choices[0].message.content
    assert long_expected and all(text for text, _ in expected.values())

    outcomes: list[tuple[int, float, bool, str]] = []  # status, seconds, Retry-After present, prompt
    first_429 = asyncio.Event()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=MAX_IN_FLIGHT + 4),
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:
        async with session.get(f"{daemon.url}/metrics") as response:
            prefilled_before = _prefilled(await response.text())
        rss_before = daemon.rss_bytes()

        async def one(i: int) -> None:
            prompt, stream = PROMPTS[i % len(PROMPTS)], i % 5 == 0
            began = time.perf_counter()
            async with session.post(url, json=_body(prompt, stream)) as response:
                if response.status == 200 and stream:
                    result = await read_sse(response)
                    assert result.done and not result.cut and not result.truncated, result
                    assert result.text == expected[prompt][0], (prompt, result.text)
                elif response.status == 200:
                    document = await response.json()
                    assert document["choices"][0]["message"]["content"] == expected[prompt][0], prompt
                else:
                    await response.read()
                    if response.status == 429:
                        first_429.set()
                outcomes.append((response.status, time.perf_counter() - began, "Retry-After" in response.headers,
                                 prompt))

        # The stream that runs through the flood: counted after the first 429 came back.
        long_chunks_after_refusals = 0
        long_started = asyncio.Event()

        def on_long_event(event: Any) -> None:
            nonlocal long_chunks_after_refusals
            long_started.set()
            long_chunks_after_refusals += first_429.is_set()

        async def long_stream() -> Any:
            async with session.post(url, json=long_body) as response:
                assert response.status == 200, await response.text()
                return await read_sse(response, on_long_event)

        streaming = asyncio.ensure_future(long_stream())
        await asyncio.wait_for(long_started.wait(), 60)

        # Overload: OVERLOAD_FACTOR x capacity, open loop, bounded in time, count and in flight.
        rate = OVERLOAD_FACTOR * capacity_rps
        running: set[asyncio.Task] = set()
        rss_peak, sent, next_at = rss_before, 0, time.monotonic()
        stop_at = next_at + OVERLOAD_S
        while time.monotonic() < stop_at and sent < min(MAX_REQUESTS, int(rate * OVERLOAD_S) + 1):
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            next_at += 1.0 / rate
            if len(running) < MAX_IN_FLIGHT:
                task = asyncio.ensure_future(one(sent))
                running.add(task)
                task.add_done_callback(running.discard)
                sent += 1
            if sent % 50 == 0:
                rss_peak = max(rss_peak, daemon.rss_bytes())
        await asyncio.gather(*running)
        long_result = await asyncio.wait_for(streaming, 120)
        rss_peak = max(rss_peak, daemon.rss_bytes())
        assert daemon.process.poll() is None, daemon.log()[-3000:]

        statuses = [s for s, *_ in outcomes]
        assert set(statuses) <= {200, 429}, {s: statuses.count(s) for s in set(statuses)}
        assert statuses.count(429) > 0 and statuses.count(200) > 0, statuses.count(200)
        assert all(retry for s, _, retry, _ in outcomes if s == 429)
        rejected = sorted(t for s, t, _, _ in outcomes if s == 429)
        admitted = sorted(t for s, t, _, _ in outcomes if s == 200)
        assert statistics.median(rejected) < statistics.median(admitted), "a refusal waited like an admission"
        assert rss_peak - rss_before < RSS_GROWTH_LIMIT, (rss_before, rss_peak)

        # The running stream: all its chunks, [DONE], its no-load answer, and chunks while refusals came back.
        assert long_result.done and not long_result.cut and not long_result.truncated and long_result.error is None
        assert long_result.text == long_expected and long_result.finish_reason == "length"
        assert long_chunks_after_refusals > 0, "the stream had ended before the flood was refused"

        # Refused requests never ran: every prefilled prompt token belongs to an admitted request.
        async with session.get(f"{daemon.url}/metrics") as response:
            metrics = await response.text()
        assert all(n == 0 for n in map(float, re.findall(
            r'edge_runtime_generation_sequences\{model="chat",state="\w+"\} (\S+)', metrics))), "sequences left"
        prefilled = _prefilled(metrics) - prefilled_before
        admitted_prompts = sum(expected[prompt][1] for s, _, _, prompt in outcomes if s == 200)
        assert prefilled == admitted_prompts + expected[PROMPTS[0]][1], (prefilled, admitted_prompts)

    # Service is normal again: requests one at a time, all answered with the no-load answer.
    for prompt in PROMPTS:
        answer = client.chat.completions.create(**_body(prompt))
        assert answer.choices[0].message.content == expected[prompt][0]
    print(f"generation overload: capacity {capacity_rps:.1f} req/s, offered {rate:.0f} req/s for {OVERLOAD_S} s: "
          f"{len(admitted)} answered (p50 {1e3 * statistics.median(admitted):.0f} ms), {len(rejected)} rejected "
          f"(p50 {1e3 * statistics.median(rejected):.1f} ms), the running stream got {long_chunks_after_refusals} "
          f"chunks after the first 429, RSS +{(rss_peak - rss_before) / 2**20:.1f} MiB")
