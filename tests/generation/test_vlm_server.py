"""Screenshots over the OpenAI chat API: a tiny random-weight Qwen2-VL folder served by the daemon.

The embedded API of the same model is the oracle (its own engine tests hold it against a no-cache
recompute); the clients are the official ``openai`` package (sync, async, streaming) and raw HTTP.
A text-only edge model with ``[cloud]`` forwards an image request to a second edge-runtime process
serving the VLM, and streams its answer.
"""

from __future__ import annotations

import asyncio
import base64
import io
import shutil
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from cloud_peer import ServerProcess
from generation_fixtures import LiveServer, base_url, served_repository, start_vlm_peer

TOKEN = "vlm-peer-token"


def _png(seed: int, width: int = 112, height: int = 84) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _messages(url: str, text: str = "What should I tap?") -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are a phone agent. Answer with the next action."},
            {"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": url, "detail": "high"}}]}]


@pytest.fixture(scope="module")
def vlm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge_runtime.vlm_zoo import write_vlm_folder

    return write_vlm_folder(tmp_path_factory.mktemp("vlm"), "qwen2_vl", seed=1)


@pytest.fixture(scope="module")
def server(vlm_folder: Path, qwen_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("vlm-repository")
    shutil.copytree(vlm_folder, root / "agent" / "1")
    (root / "agent" / "config.toml").write_text('[vision]\nmax_images = 2\nplan = "cpu"\n')
    with served_repository(root, tmp_path_factory.mktemp("cache")) as live:
        yield live


def _model(server: LiveServer, name: str = "agent") -> Any:
    from edge_runtime.server.state import STATE

    return server.app[STATE].repository.get(name).model


def _client(url: str, token: str = "unused") -> Any:
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0, timeout=120)


def test_chat_with_a_screenshot_equals_the_embedded_api(server: LiveServer) -> None:
    messages = _messages(_url(_png(1)))
    expected = _model(server).generate(messages=messages, max_tokens=12)
    client = _client(base_url(server))
    whole = client.chat.completions.create(model="agent", messages=messages, max_tokens=12, temperature=0)
    assert whole.choices[0].message.content == expected.text
    assert whole.usage.prompt_tokens == expected.usage.prompt_tokens  # image tokens counted in both
    assert whole.usage.prompt_tokens > len(_model(server).prepare(messages=[messages[0]]).ids) + 1
    stream = client.chat.completions.create(model="agent", messages=messages, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
    assert chunks[-1].usage.completion_tokens == expected.usage.completion_tokens


def test_async_clients_mixing_images_and_text_get_their_own_answers(server: LiveServer) -> None:
    import openai

    requests = [_messages(_url(_png(2))), [{"role": "user", "content": "tap the home button"}],
                _messages(_url(_png(3)), "Where is the search box?")]

    async def main() -> list[str]:
        client = openai.AsyncOpenAI(base_url=base_url(server) + "/v1", api_key="unused", max_retries=0, timeout=120)
        try:
            answers = await asyncio.gather(*(client.chat.completions.create(
                model="agent", messages=m, max_tokens=10, temperature=0) for m in requests))
        finally:
            await client.close()
        return [a.choices[0].message.content for a in answers]

    texts = asyncio.run(main())
    model = _model(server)
    assert texts == [model.generate(messages=m, max_tokens=10).text for m in requests]


ACTION_SCHEMA = {"type": "object", "properties": {
    "action": {"enum": ["tap", "swipe", "back"]}, "x": {"type": "integer", "minimum": 0, "maximum": 1080},
    "y": {"type": "integer", "minimum": 0, "maximum": 2400}}, "required": ["action", "x", "y"],
    "additionalProperties": False}
TAP_TOOL = {"type": "function", "function": {"name": "tap", "description": "tap the screen", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 1080},
                                     "y": {"type": "integer", "minimum": 0, "maximum": 2400}},
    "required": ["x", "y"], "additionalProperties": False}}}


def test_a_screenshot_step_answers_a_json_action_and_a_forced_tool_call(server: LiveServer) -> None:
    """Screenshots in, actions out: the random-weight VLM writes no JSON of its own; constrained, every
    sampled answer validates, and a forced tool call's arguments validate against the tool."""
    import json

    import jsonschema

    client = _client(base_url(server))
    for seed in range(3):
        messages = _messages(_url(_png(20 + seed)))
        answer = client.chat.completions.create(
            model="agent", messages=messages, max_tokens=96, temperature=1.0, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "action", "schema": ACTION_SCHEMA}})
        choice = answer.choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), ACTION_SCHEMA)
        called = client.chat.completions.create(model="agent", messages=messages, max_tokens=96, temperature=1.0,
                                                seed=seed, tools=[TAP_TOOL], tool_choice="required")
        assert called.choices[0].finish_reason == "tool_calls", called.choices[0]
        calls = called.choices[0].message.tool_calls
        assert calls  # parallel_tool_calls defaults to true: one call or several
        for call in calls:
            assert call.function.name == "tap"
            jsonschema.validate(json.loads(call.function.arguments), TAP_TOOL["function"]["parameters"])


def test_tools_reach_a_vlm_chat_template(vlm_folder: Path, tmp_path: Path) -> None:
    import json

    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    folder = tmp_path / "vlm"
    shutil.copytree(vlm_folder, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% if tools %}TOOLS:{% for t in tools %} {{ t.function.name }}{% endfor %}\n"
                               "{% endif %}" + config["chat_template"])
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    runtime = Runtime(RuntimeConfig(cache_dir=tmp_path / "cache", probe_opencl=False, intra_op_threads=1))
    try:
        model = runtime.load(folder)
        messages = _messages(_url(_png(30)))
        text = model.prepare(messages=messages, tools=[TAP_TOOL]).text
        assert text.startswith("TOOLS: tap"), text[:120]
        assert "TOOLS:" not in model.prepare(messages=messages).text
    finally:
        runtime.close()


def test_metrics_count_the_image_work(server: LiveServer) -> None:
    def scrape() -> dict[str, float]:
        with urllib.request.urlopen(base_url(server) + "/metrics") as response:
            text = response.read().decode()
        wanted = ("edge_runtime_image_preprocess_seconds_count", "edge_runtime_vision_encode_seconds_sum",
                  "edge_runtime_image_tokens_total", "edge_runtime_images_total",
                  "edge_runtime_image_feature_cache_hits_total", "edge_runtime_image_feature_cache_misses_total",
                  "edge_runtime_image_feature_cache_bytes")
        return {name: float(line.split()[-1]) for line in text.splitlines() for name in wanted
                if line.startswith(name + '{model="agent"}')}

    messages = _messages(_url(_png(4)))
    before = scrape()
    _client(base_url(server)).chat.completions.create(model="agent", messages=messages, max_tokens=2,
                                                      temperature=0)
    after = scrape()
    prepared = _model(server).prepare(messages=messages)  # the image tokens this request cost (a cache hit)
    assert after["edge_runtime_images_total"] - before.get("edge_runtime_images_total", 0) == 1
    assert after["edge_runtime_image_tokens_total"] - before.get("edge_runtime_image_tokens_total", 0) \
        == prepared.image_timings.image_tokens
    assert after["edge_runtime_image_preprocess_seconds_count"] > before.get(
        "edge_runtime_image_preprocess_seconds_count", 0)
    assert after["edge_runtime_vision_encode_seconds_sum"] > before.get("edge_runtime_vision_encode_seconds_sum", 0)
    # The screenshot was new: encoded and kept. Sent again (a chat resends its history), it is not encoded.
    assert after["edge_runtime_image_feature_cache_misses_total"] \
        == before.get("edge_runtime_image_feature_cache_misses_total", 0) + 1
    assert after["edge_runtime_image_feature_cache_bytes"] > 0
    hits = after["edge_runtime_image_feature_cache_hits_total"] + 1  # prepare() above was one
    _client(base_url(server)).chat.completions.create(model="agent", messages=messages, max_tokens=2,
                                                      temperature=0)
    again = scrape()
    assert again["edge_runtime_image_feature_cache_hits_total"] == hits + 1
    misses = "edge_runtime_image_feature_cache_misses_total"
    assert again[misses] == after[misses]


def test_n_choices_of_a_screenshot_prepare_it_once(server: LiveServer) -> None:
    """Two seeded choices of one screenshot step: the image is decoded and encoded once for both, and
    each choice equals a request of its own with its seed (``seed + index``)."""
    def images() -> tuple[float, float]:
        with urllib.request.urlopen(base_url(server) + "/metrics") as response:
            lines = response.read().decode().splitlines()
        value = {line.split("{")[0]: float(line.split()[-1]) for line in lines
                 if line.startswith(("edge_runtime_images_total{", "edge_runtime_image_feature_cache_misses_total{"))
                 and '{model="agent"}' in line}
        return value.get("edge_runtime_images_total", 0), value.get("edge_runtime_image_feature_cache_misses_total", 0)

    messages = _messages(_url(_png(9)), "Which button opens the settings?")
    before = images()
    whole = _client(base_url(server)).chat.completions.create(model="agent", messages=messages, max_tokens=10,
                                                              temperature=1.0, seed=5, n=2)
    after = images()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)  # one image read, one encoder run
    alone = [_model(server).generate(messages=messages, max_tokens=10, temperature=1.0, seed=5 + i) for i in range(2)]
    assert [c.message.content for c in whole.choices] == [a.text for a in alone]
    assert whole.usage.prompt_tokens == alone[0].usage.prompt_tokens
    assert whole.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)


def test_bad_images_get_named_400s_and_the_model_keeps_answering(server: LiveServer) -> None:
    import openai

    client = _client(base_url(server))
    png = _png(5)
    truncated = _url(png[: len(png) // 2])
    gif = "data:image/gif;base64," + base64.b64encode(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;").decode()
    cases = [
        ("data:image/png;base64,@@not base64@@", "messages[1].content[1]"),
        ("data:image/png;base64," + base64.b64encode(b"hello, not an image").decode(), "messages[1].content[1]"),
        (truncated, "messages[1].content[1]"),
        (gif, "messages[1].content[1]"),
        ("http://127.0.0.1:9/shot.png", "messages[1].content[1]"),  # nothing is fetched unless allow-listed
        ("file:///etc/passwd", "messages[1].content[1]"),
    ]
    for url, where in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="agent", messages=_messages(url), max_tokens=2)
        assert where in caught.value.body["message"], (url[:40], caught.value.body)
    three = _messages(_url(png))
    three[1]["content"] += [three[1]["content"][1], three[1]["content"][1]]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="agent", messages=three, max_tokens=2)
    assert "At most 2 image(s) may be provided in one prompt." in caught.value.body["message"]
    ok = client.chat.completions.create(model="agent", messages=_messages(_url(png)), max_tokens=3, temperature=0)
    assert ok.choices[0].message.content == _model(server).generate(messages=_messages(_url(png)), max_tokens=3).text


@pytest.fixture(scope="module")
def vlm_peer(tmp_path_factory: pytest.TempPathFactory, vlm_folder: Path) -> Iterator[ServerProcess]:
    server = start_vlm_peer(tmp_path_factory, vlm_folder, TOKEN)
    yield server
    server.stop()


def test_a_text_only_model_forwards_a_screenshot_to_its_vlm_cloud_peer(
        vlm_peer: ServerProcess, qwen_folder: Path, vlm_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    from edge_runtime.cloud.config import CloudConfig
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.runtime import Runtime
    from edge_runtime.server.app import create_app
    from edge_runtime.server.config import ServerConfig
    from edge_runtime.serving.repository import ModelRepository

    root = tmp_path_factory.mktemp("edge-text-repository")
    shutil.copytree(qwen_folder, root / "chat" / "1")
    (root / "chat" / "config.toml").write_text('[cloud]\nmode = "fallback"\nremote_model = "agent"\n')
    runtime = Runtime(RuntimeConfig(cache_dir=tmp_path_factory.mktemp("cache"), probe_opencl=False,
                                    intra_op_threads=1))
    cloud = CloudConfig(url=vlm_peer.url, token=TOKEN, timeout_ms=120000, breaker_failures=5)
    live = LiveServer(create_app(ServerConfig(), ModelRepository(root, runtime, cloud=cloud,
                                                                 drain_timeout_s=5.0))).start()
    oracle = GenerativeModel("oracle", vlm_folder)
    try:
        messages = _messages(_url(_png(6)))
        expected = oracle.generate(messages=messages, max_tokens=10)
        stream = _client(base_url(live)).chat.completions.create(model="chat", messages=messages, max_tokens=10,
                                                                 temperature=0, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == expected.text  # the peer read the screenshot: its answer is the VLM's, image included
    finally:
        oracle.close()
        live.stop()
        runtime.close()


@pytest.mark.parametrize("family", ["glm4v", "qwen3_vl"])
def test_an_agent_step_over_http_equals_the_embedded_api(family: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """GLM-4.1V (AutoGLM-Phone's architecture) and Qwen3-VL (DeepStack rows) served: an Open-AutoGLM-style
    step (system prompt, the screenshot in the newest user turn, temperature 0, top_p 0.85,
    frequency_penalty 0.2, streamed) answers as the embedded API does; the next step (the first
    screenshot stripped from the history, a new one in the newest turn) reads the prompt both steps
    share from the prefix cache, up to the place where the first step's screenshot was."""
    from edge_runtime.vlm_zoo import write_vlm_folder

    root = tmp_path_factory.mktemp(f"{family}-repository")
    write_vlm_folder(root / "agent" / "1", family, seed=2)
    (root / "agent" / "config.toml").write_text('[vision]\nplan = "cpu"\n')
    sampling = dict(max_tokens=10, temperature=0, top_p=0.85, frequency_penalty=0.2)
    first = _messages(_url(_png(4)), "Open the settings app.")
    with served_repository(root, tmp_path_factory.mktemp(f"{family}-cache")) as live:
        model = _model(live, "agent")
        client = _client(base_url(live))
        stream = client.chat.completions.create(model="agent", messages=first, stream=True,
                                                stream_options={"include_usage": True}, **sampling)
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        expected = model.generate(messages=first, **{k: v for k, v in sampling.items() if k != "temperature"})
        assert text == expected.text and chunks[-1].usage.prompt_tokens == expected.usage.prompt_tokens
        stripped = [first[0], {"role": "user", "content": "Open the settings app."},
                    {"role": "assistant", "content": text}]
        second = [*stripped, _messages(_url(_png(5)), "Turn on Wi-Fi.")[1]]
        answer = client.chat.completions.create(model="agent", messages=second, **sampling)
        ids = [model.prepare(messages=m).ids for m in (first, second)]
        shared = next(i for i, (a, b) in enumerate(zip(*ids)) if a != b)
        block = model.settings.prefix_block_tokens
        assert shared >= block and shared - block < answer.usage.prompt_tokens_details.cached_tokens <= shared
        assert answer.choices[0].message.content == model.generate(
            messages=second, **{k: v for k, v in sampling.items() if k != "temperature"}).text


def test_tokenize_counts_a_screenshot_without_encoding_it(server: LiveServer) -> None:
    """vLLM's ``/tokenize`` on a chat with a screenshot: the ids the request prefills (image tokens
    included, prepare's ids are the oracle) while the vision encoder never runs (no image recorded)."""
    import json as json_module

    from generation_fixtures import post_json

    model = _model(server)
    messages = _messages(_url(_png(9, 140, 308)))
    images_before = model.vision_stats.images
    status, answer = post_json(server, "/tokenize", {"model": "agent", "messages": messages})
    assert status == 200, answer
    assert model.vision_stats.images == images_before  # counted, not encoded
    expected = model.prepare(messages=messages).ids
    assert answer["tokens"] == expected and answer["count"] == len(expected)
    assert expected.count(model.vlm.image_token_id) > 0
    status, answer = post_json(server, "/tokenize", {"model": "agent",
                                                     "messages": _messages("data:image/png;base64,AAAA")})
    assert status == 400 and "messages[1].content[1]" in json_module.dumps(answer)


def test_a_request_sets_its_own_image_budget_with_mm_processor_kwargs(server: LiveServer) -> None:
    """vLLM's ``mm_processor_kwargs`` through the ``openai`` client's ``extra_body``: the answer and the
    prompt tokens of the embedded API given the same arguments (which ``test_vlm_request_budget`` holds
    against the model configured with that budget); fewer image tokens than the model's own budget;
    ``/tokenize`` counts the same; a bad argument is a 400 naming it, and the model keeps answering."""
    import openai

    from generation_fixtures import post_json

    client = _client(base_url(server))
    messages = _messages(_url(_png(11, 224, 448)))
    kwargs = {"max_pixels": 28 * 28 * 8}
    expected = _model(server).generate(messages=messages, max_tokens=6, mm_processor_kwargs=kwargs)
    own = _model(server).generate(messages=messages, max_tokens=6)
    answer = client.chat.completions.create(model="agent", messages=messages, max_tokens=6, temperature=0,
                                            extra_body={"mm_processor_kwargs": kwargs})
    assert answer.choices[0].message.content == expected.text
    assert answer.usage.prompt_tokens == expected.usage.prompt_tokens < own.usage.prompt_tokens
    status, counted = post_json(server, "/tokenize", {"model": "agent", "messages": messages,
                                                      "mm_processor_kwargs": kwargs})
    assert status == 200 and counted["count"] == expected.usage.prompt_tokens
    for bad, named in (({"max_pixels": -1}, "mm_processor_kwargs: max_pixels must be a positive integer"),
                       ({"longest_edge": 9}, "mm_processor_kwargs: unknown image processor argument(s)"),
                       ("big", "'mm_processor_kwargs' must be an object")):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="agent", messages=messages, max_tokens=2,
                                           extra_body={"mm_processor_kwargs": bad})
        assert named in caught.value.body["message"], caught.value.body
    again = client.chat.completions.create(model="agent", messages=messages, max_tokens=6, temperature=0)
    assert again.choices[0].message.content == own.text
