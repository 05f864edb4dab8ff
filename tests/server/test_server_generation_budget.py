"""Generative models and the memory budget through the real app: warm-up before ready, the charge
(weights + KV buffers + prefix cache), lazy load through the generation routes, LRU unload that
never takes a model with a stream in flight.

The model is the torch-free tiny decoder of ``edge_runtime.decoder_zoo``. Oracles: the KV size is
computed here from the folder's ``config.json`` and the ``[generation]`` table, not read from the
engine; "no warm-up work in the first request" is the engine's run counter. A gate
(threading.Event), not a sleep, holds a stream or a warm-up in flight.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from test_server_metrics import samples, value

BATCH, MAX_SEQ_LEN, PREFIX_CACHE_BYTES = 2, 96, 8192
GENERATION = (f"[generation]\nmax_batch_size = {BATCH}\nmax_seq_len = {MAX_SEQ_LEN}\n"
              f"prefix_cache_bytes = {PREFIX_CACHE_BYTES}\nprefix_block_tokens = 4\n")
CHAT = {"messages": [{"role": "user", "content": "open the settings"}], "max_tokens": 5, "temperature": 0,
        "ignore_eos": True}  # ignore_eos: exactly max_tokens tokens, so the decode steps are known


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge_runtime.decoder_zoo import DecoderShape, write_decoder_folder

    shape = DecoderShape(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=600, max_positions=128)
    return write_decoder_folder(tmp_path_factory.mktemp("decoder") / "tiny", shape, seed=1)


def repository_of(tmp_path: Path, decoder: Path, names: tuple[str, ...], config: str = GENERATION) -> Path:
    root = tmp_path / "repo"
    for name in names:
        shutil.copytree(decoder, root / name / "1")
        (root / name / "config.toml").write_text(config)
    return root


def app_for(runtime: Any, root: Path, **memory: Any) -> Any:
    from edge_runtime.memory_budget import MemoryConfig
    from edge_runtime.server.app import create_app
    from edge_runtime.server.config import ServerConfig
    from edge_runtime.serving.repository import ModelRepository

    return create_app(ServerConfig(), ModelRepository(root, runtime, drain_timeout_s=5.0,
                                                      memory=MemoryConfig(**memory)))


def repository(client: Any) -> Any:
    from edge_runtime.server.state import STATE

    return client.server.app[STATE].repository


def expected_charge(folder: Path, factor: float = 1.0) -> dict[str, int]:
    """The budget parts, from the model's config.json and our [generation] table."""
    config = json.loads((folder / "config.json").read_text())
    layers, kv_heads = config["num_hidden_layers"], config["num_key_value_heads"]
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    dtype_bytes = 4  # the zoo writes float32 weights and KV
    positions = min(config["max_position_embeddings"], MAX_SEQ_LEN)
    buffers = 2  # past and present: each layer tensor is double-buffered
    kv = buffers * BATCH * positions * layers * 2 * kv_heads * head_dim * dtype_bytes
    weights = sum(p.stat().st_size for p in folder.iterdir() if p.name.startswith("model.onnx"))
    return {"weights": int(weights * factor), "kv_cache": kv, "prefix_cache": PREFIX_CACHE_BYTES}


@pytest.fixture
def gate() -> Iterator[tuple[threading.Event, threading.Event]]:
    entered, release = threading.Event(), threading.Event()
    yield entered, release
    release.set()


def gated(inner: Callable[..., Any], entered: threading.Event, release: threading.Event) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        entered.set()
        assert release.wait(timeout=60), "the test never opened the gate"
        return inner(*args)

    return call


async def stats_of(client: Any, name: str) -> dict[str, Any]:
    return (await (await client.get(f"/v2/models/{name}/stats")).json())["model_stats"][0]["edge_runtime"]


async def test_ready_only_after_warm_up_and_the_first_request_pays_none_of_it(
        aiohttp_client: Any, runtime: Any, decoder: Path, tmp_path: Path, gate: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from edge_runtime.generation.batcher import ContinuousBatcher

    entered, release = gate
    monkeypatch.setattr(ContinuousBatcher, "warm_up", gated(ContinuousBatcher.warm_up, entered, release))
    client = await aiohttp_client(app_for(runtime, repository_of(tmp_path, decoder, ("tiny",)), lazy_load=True))
    loading = asyncio.ensure_future(client.post("/v2/repository/models/tiny/load"))
    assert await asyncio.to_thread(entered.wait, 60)  # the load is warming up, in its worker thread
    assert (await client.get("/v2/models/tiny/ready")).status == 404
    release.set()
    assert (await loading).status == 200
    assert (await client.get("/v2/models/tiny/ready")).status == 200
    warmup = (await stats_of(client, "tiny"))["warmup"]
    assert warmup["done"] and warmup["runs"] == 1 and warmup["errors"] == {}
    assert warmup["shapes"] == [{"prompt_tokens": 16, "decode_steps": 2}]
    assert list(warmup["first_run_ms"]) == ["generate"]
    model = repository(client).get("tiny").model
    assert (model.engine.runs, model.batcher.warmups) == (1 + 2, 1)  # one prefill chunk, two decode steps
    before = model.batcher.stats()
    assert (before.steps, before.tokens_generated, model.prefix_cache.stats().lookups) == (0, 0, 0)

    response = await client.post("/v1/chat/completions", json={**CHAT, "model": "tiny"})
    assert response.status == 200
    usage = (await response.json())["usage"]
    assert usage["completion_tokens"] == CHAT["max_tokens"]
    # The request ran its own prefill chunk and one decode step per token after the first, nothing more.
    assert model.engine.runs == 3 + 1 + (CHAT["max_tokens"] - 1)
    assert model.batcher.warmups == 1


async def test_warm_up_can_be_switched_off(aiohttp_client: Any, runtime: Any, decoder: Path, tmp_path: Path) -> None:
    root = repository_of(tmp_path, decoder, ("cold",), GENERATION + "[warmup]\nenabled = false\n")
    client = await aiohttp_client(app_for(runtime, root))
    assert (await client.get("/v2/models/cold/ready")).status == 200
    assert (await stats_of(client, "cold"))["warmup"]["done"] is False
    assert repository(client).get("cold").model.engine.runs == 0
    (root / "cold" / "config.toml").write_text(GENERATION + "[warmup]\nshapes = [{ input_ids = [1, 8] }]\n")
    response = await client.post("/v2/repository/models/cold/load")
    assert response.status == 400 and "prompt_tokens" in (await response.json())["error"]


async def test_the_charge_is_weights_plus_kv_buffers_plus_prefix_cache(aiohttp_client: Any, runtime: Any,
                                                                       decoder: Path, tmp_path: Path) -> None:
    want = expected_charge(decoder, factor=1.5)
    client = await aiohttp_client(app_for(runtime, repository_of(tmp_path, decoder, ("tiny",)),
                                          budget_bytes=10 * sum(want.values()), footprint_factor=1.5))
    stats = await stats_of(client, "tiny")
    assert stats["memory_bytes"]["parts"] == want
    assert stats["memory_bytes"]["charged"] == sum(want.values())
    assert stats["generation"]["kv_cache_bytes"] == want["kv_cache"]
    assert stats["generation"]["prefix_cache_budget_bytes"] == PREFIX_CACHE_BYTES
    assert stats["generation"]["prefix_cache_bytes"] == 0
    assert (await client.post("/v1/chat/completions", json={**CHAT, "model": "tiny"})).status == 200
    # The batcher caches the answer's blocks just after sending the last chunk: read once it settled.
    held, last = -1, None
    for _ in range(100):
        held, last = (await stats_of(client, "tiny"))["generation"]["prefix_cache_bytes"], held
        if held == last:
            break
        await asyncio.sleep(0.05)
    assert 0 < held <= PREFIX_CACHE_BYTES  # the prompt's 4-token blocks were cached
    found = samples(await (await client.get("/metrics")).text())
    assert value(found, "edge_runtime_generation_kv_cache_bytes", model="tiny") == want["kv_cache"]
    assert value(found, "edge_runtime_prefix_cache_bytes", model="tiny") == held
    assert value(found, "edge_runtime_model_memory_charged_bytes", model="tiny") == sum(want.values())
    assert value(found, "edge_runtime_memory_budget_used_bytes") == sum(want.values())


async def test_a_budget_below_the_full_charge_fails_the_load_naming_the_parts(
        aiohttp_client: Any, runtime: Any, decoder: Path, tmp_path: Path) -> None:
    want = expected_charge(decoder)
    total = sum(want.values())
    client = await aiohttp_client(app_for(runtime, repository_of(tmp_path, decoder, ("tiny",)), lazy_load=True,
                                          budget_bytes=total - 1, footprint_factor=1.0))
    response = await client.post("/v1/chat/completions", json={**CHAT, "model": "tiny"})
    assert response.status == 400
    message = (await response.json())["error"]["message"]
    for number in (*want.values(), total, total - 1):
        assert str(number) in message
    assert "prefix_cache_bytes" in message and "max_batch_size" in message
    assert (await client.get("/v2/models/tiny/ready")).status == 404


async def test_lazy_load_through_chat_completions(aiohttp_client: Any, runtime: Any, decoder: Path,
                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import edge_runtime.generation.warmup as warmup

    loads = []
    real = warmup.warm_up_generative
    monkeypatch.setattr(warmup, "warm_up_generative",
                        lambda model, config: loads.append(model.name) or real(model, config))
    client = await aiohttp_client(app_for(runtime, repository_of(tmp_path, decoder, ("tiny",)), lazy_load=True))
    listed = (await (await client.get("/v1/models")).json())["data"]
    assert [(m["id"], m["loaded"]) for m in listed] == [("tiny", False)]
    assert (await client.get("/v2/models/tiny/ready")).status == 404
    responses = await asyncio.gather(*(client.post("/v1/chat/completions", json={**CHAT, "model": "tiny"})
                                       for _ in range(3)))
    assert [r.status for r in responses] == [200, 200, 200]
    assert loads == ["tiny"]  # one load (and warm-up) served all three
    assert (await client.get("/v2/models/tiny/ready")).status == 200
    listed = (await (await client.get("/v1/models")).json())["data"]
    assert [(m["id"], m["loaded"], m["context_length"], m["max_model_len"]) for m in listed] == [
        ("tiny", True, MAX_SEQ_LEN, MAX_SEQ_LEN)]  # vLLM's name for it too
    missing = await client.post("/v1/chat/completions", json={**CHAT, "model": "nosuch"})
    assert missing.status == 404 and (await missing.json())["error"]["code"] == "model_not_found"


async def test_the_generate_route_loads_lazily_too(aiohttp_client: Any, runtime: Any, decoder: Path,
                                                   tmp_path: Path) -> None:
    client = await aiohttp_client(app_for(runtime, repository_of(tmp_path, decoder, ("tiny",)), lazy_load=True))
    response = await client.post("/v2/models/tiny/generate", json={"text_input": "open", "max_tokens": 3})
    assert response.status == 200 and (await response.json())["model_name"] == "tiny"
    assert (await client.get("/v2/models/tiny/ready")).status == 200


async def test_a_tiny_budget_unloads_an_idle_generative_model_but_never_one_streaming(
        aiohttp_client: Any, runtime: Any, decoder: Path, tmp_path: Path, gate: Any) -> None:
    one = sum(expected_charge(decoder).values())
    client = await aiohttp_client(app_for(runtime, repository_of(tmp_path, decoder, ("alpha", "beta")),
                                          lazy_load=True, budget_bytes=int(one * 1.5), footprint_factor=1.0))
    assert (await client.post("/v1/chat/completions", json={**CHAT, "model": "alpha"})).status == 200
    assert (await client.post("/v1/chat/completions", json={**CHAT, "model": "beta"})).status == 200
    assert (await client.get("/v2/models/alpha/ready")).status == 404  # idle: unloaded to make room
    reasons = {e["name"]: e["reason"] for e in await (await client.post("/v2/repository/index", json={})).json()}
    assert "memory budget" in reasons["alpha"]

    entered, release = gate
    engine = repository(client).get("beta").model.engine
    engine.decode = gated(engine.decode, entered, release)  # the stream's first decode step waits

    async def stream() -> tuple[int, str]:
        response = await client.post("/v1/chat/completions", json={**CHAT, "model": "beta", "stream": True})
        return response.status, await response.text()

    streaming = asyncio.ensure_future(stream())
    assert await asyncio.to_thread(entered.wait, 60)
    refused = await client.post("/v2/repository/models/alpha/load")  # only the streaming beta could make room
    assert refused.status == 429 and "Retry-After" in refused.headers
    assert "busy models ['beta']" in (await refused.json())["error"]
    lazy = await client.post("/v1/chat/completions", json={**CHAT, "model": "alpha"})
    assert lazy.status == 429 and "Retry-After" in lazy.headers
    assert (await lazy.json())["error"]["type"] == "rate_limit_error"
    assert (await client.get("/v2/models/beta/ready")).status == 200
    release.set()
    status, text = await streaming
    assert status == 200 and text.rstrip().endswith("data: [DONE]")
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert (await client.post("/v2/repository/models/alpha/load")).status == 200  # beta is idle now: it goes
    assert (await client.get("/v2/models/beta/ready")).status == 404


async def test_an_async_generation_task_holds_its_model_until_it_finishes(
        aiohttp_client: Any, runtime: Any, decoder: Path, tmp_path: Path, gate: Any) -> None:
    one = sum(expected_charge(decoder).values())
    client = await aiohttp_client(app_for(runtime, repository_of(tmp_path, decoder, ("alpha", "beta")),
                                          budget_bytes=int(one * 1.5), footprint_factor=1.0))
    served = {v.name for v in repository(client).served()}
    assert len(served) == 1  # the second eager load found no room: one of them is served
    (loaded,), (other,) = served, {"alpha", "beta"} - served
    entered, release = gate
    engine = repository(client).get(loaded).model.engine
    engine.decode = gated(engine.decode, entered, release)
    accepted = await client.post("/v1/chat/completions", json={**CHAT, "model": loaded, "async": True})
    assert accepted.status == 202
    location = accepted.headers["Location"]
    assert await asyncio.to_thread(entered.wait, 60)
    refused = await client.post(f"/v2/repository/models/{other}/load")
    assert refused.status == 429 and "Retry-After" in refused.headers
    release.set()
    for _ in range(1200):  # bounded poll of the task
        task = await (await client.get(location)).json()
        if task["status"] != "pending":
            break
        await asyncio.sleep(0.05)
    assert task["status"] == "succeeded", task
    assert (await client.post(f"/v2/repository/models/{other}/load")).status == 200
    # Unloaded with nothing in flight: no entry left (a leaked hold would keep one, counting in_flight).
    assert loaded not in repository(client).budget.snapshot()["owners"]
