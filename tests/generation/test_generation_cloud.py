"""Edge-cloud for generation against a second edge-runtime process (an OpenAI-compatible peer).

The peer serves the same weights as ``chat``, so whichever side answers, greedy
output must be the same tokens: the local model is the oracle of the cloud path.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from cloud_peer import ServerProcess
from generation_fixtures import LiveServer, base_url

TOKEN = "generation-peer-token"
LONG = [{"role": "user", "content": "open close swipe left right home back wait type search result page title"}]


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory, qwen_folder: Path) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("peer-repository")
    shutil.copytree(qwen_folder, root / "chat" / "1")
    shutil.copytree(qwen_folder, root / "thinker" / "1")  # the same weights, its <think> part read apart
    (root / "thinker" / "config.toml").write_text('[generation]\nreasoning_parser = "qwen3"\n'
                                                  'structured_in_reasoning = true\n')
    server = ServerProcess.start(root, tmp_path_factory.mktemp("peer-logs") / "peer.log",
                                 env={"EDGE_RUNTIME_TOKEN": TOKEN}, timeout_s=120)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def edge(peer: ServerProcess, tmp_path_factory: pytest.TempPathFactory, qwen_folder: Path) -> Iterator[LiveServer]:
    from edge_runtime.cloud.config import CloudConfig
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime
    from edge_runtime.server.app import create_app
    from edge_runtime.server.config import ServerConfig
    from edge_runtime.serving.repository import ModelRepository

    root = tmp_path_factory.mktemp("edge-repository")
    configs = {
        "local": "",
        "small": '[generation]\nmax_seq_len = 24\n[cloud]\nmode = "fallback"\nremote_model = "chat"\n',
        "always": '[cloud]\nmode = "always"\nremote_model = "chat"\n',
        "dead": '[cloud]\nmode = "always"\nremote_model = "no-such-model"\n',
        "thinking-peer": '[cloud]\nmode = "always"\nremote_model = "thinker"\n',
    }
    for name, config in configs.items():
        shutil.copytree(qwen_folder, root / name / "1")
        (root / name / "config.toml").write_text(config)
    runtime = Runtime(RuntimeConfig(cache_dir=tmp_path_factory.mktemp("cache"), probe_opencl=False,
                                    intra_op_threads=1))
    cloud = CloudConfig(url=peer.url, token=TOKEN, timeout_ms=60000, breaker_failures=5)
    app = create_app(ServerConfig(), ModelRepository(root, runtime, cloud=cloud, drain_timeout_s=5.0))
    live = LiveServer(app).start()
    yield live
    live.stop()
    runtime.close()


def _metric(server: LiveServer, prefix: str) -> float:
    import urllib.request

    with urllib.request.urlopen(base_url(server) + "/metrics") as response:
        lines = [line for line in response.read().decode().splitlines() if line.startswith(prefix)]
    return float(lines[0].split()[-1]) if lines else 0.0


def _client(server: Any, token: str = "unused") -> Any:
    import openai

    return openai.OpenAI(base_url=(server.url if isinstance(server, ServerProcess) else base_url(server)) + "/v1",
                         api_key=token, max_retries=0, timeout=60)


def test_an_image_for_a_text_only_model_goes_to_its_cloud_peer_intact(edge: LiveServer, peer: ServerProcess) -> None:
    """The peer here reads text only too, so it answers with vLLM's 400: proof that the request reached
    it with its image part intact (the edge did not strip it), and that a model without [cloud]
    answers the same 400 itself."""
    import openai

    messages = [{"role": "user", "content": [
        {"type": "text", "text": "tap the button"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]
    with pytest.raises(openai.BadRequestError) as local:
        _client(edge).chat.completions.create(model="local", messages=messages, max_tokens=4)
    assert "local is not a multimodal model" in local.value.body["message"]
    with pytest.raises(openai.APIError) as forwarded:
        _client(edge).chat.completions.create(model="small", messages=messages, max_tokens=4, temperature=0)
    assert "chat is not a multimodal model" in str(forwarded.value)  # the peer's own model name: it got there
    assert forwarded.value.status_code == 502  # the peer refused it: a cloud failure with no local fallback


def test_prompt_beyond_the_local_context_goes_to_the_cloud(edge: LiveServer, peer: ServerProcess) -> None:
    import openai

    expected = _client(edge).chat.completions.create(model="local", messages=LONG, max_tokens=12, temperature=0)
    direct = _client(peer, TOKEN).chat.completions.create(model="chat", messages=LONG, max_tokens=12, temperature=0)
    routed = _client(edge).chat.completions.create(model="small", messages=LONG, max_tokens=12, temperature=0)
    assert routed.choices[0].message.content == direct.choices[0].message.content == expected.choices[0].message.content
    assert routed.usage.completion_tokens == expected.usage.completion_tokens
    assert _metric(edge, 'edge_runtime_cloud_calls_total{model="small",outcome="ok"}') >= 1
    with pytest.raises(openai.AuthenticationError):  # the peer really checks the token the edge sent
        _client(peer, "wrong").chat.completions.create(model="chat", messages=LONG, max_tokens=2)


def test_cloud_streams_pass_through_chunk_by_chunk(edge: LiveServer) -> None:
    client = _client(edge)
    expected = client.completions.create(model="local", prompt="the agent taps", max_tokens=16, temperature=0)
    chunks = list(client.completions.create(model="always", prompt="the agent taps", max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.choices[0].text
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1
    assert chunks[-1].usage.completion_tokens == expected.usage.completion_tokens


def test_n_choices_go_to_the_cloud_peer_one_seeded_choice_at_a_time(edge: LiveServer, peer: ServerProcess) -> None:
    """Each choice is forwarded as a request of its own (``n`` 1, ``seed + index``): the peer, asked
    directly for those, gives the same texts; the local model gives them too (same weights)."""
    kwargs = dict(messages=LONG, max_tokens=10, temperature=1.0)
    direct = [_client(peer, TOKEN).chat.completions.create(model="chat", seed=11 + i, **kwargs).choices[0]
              for i in range(2)]
    calls = _metric(edge, 'edge_runtime_cloud_calls_total{model="always",outcome="ok"}')
    routed = _client(edge).chat.completions.create(model="always", seed=11, n=2, **kwargs)
    assert _metric(edge, 'edge_runtime_cloud_calls_total{model="always",outcome="ok"}') == calls + 2
    assert [c.message.content for c in routed.choices] == [d.message.content for d in direct]
    local = _client(edge).chat.completions.create(model="local", seed=11, n=2, **kwargs)
    assert [c.message.content for c in local.choices] == [d.message.content for d in direct]
    assert len({d.message.content for d in direct}) == 2


def test_a_cloud_failure_before_the_first_token_falls_back_to_local(edge: LiveServer) -> None:
    client = _client(edge)
    expected = client.chat.completions.create(model="local", messages=LONG, max_tokens=10, temperature=0)
    got = client.chat.completions.create(model="dead", messages=LONG, max_tokens=10, temperature=0)
    assert got.choices[0].message.content == expected.choices[0].message.content
    assert _metric(edge, 'edge_runtime_cloud_calls_total{model="dead",outcome="http_error"}') >= 1


def test_tools_and_schemas_go_to_the_cloud_peer_unchanged(edge: LiveServer) -> None:
    """The peer serves the same weights: with the same seed its constrained answer is the local one."""
    import json

    tool = {"type": "function", "function": {"name": "tap", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["x"], "additionalProperties": False}}}
    kwargs = dict(messages=LONG, max_tokens=60, seed=4, tools=[tool], tool_choice="required",
                  parallel_tool_calls=False)
    client = _client(edge)
    here = client.chat.completions.create(model="local", **kwargs).choices[0]
    there = client.chat.completions.create(model="always", **kwargs).choices[0]
    assert here.finish_reason == there.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in there.message.tool_calls] == [
        (c.function.name, json.loads(c.function.arguments)) for c in here.message.tool_calls]
    streamed = "".join(d.function.arguments or "" for chunk in client.chat.completions.create(
        model="always", stream=True, **kwargs) for choice in chunk.choices for d in choice.delta.tool_calls or ())
    assert json.loads(streamed) == json.loads(here.message.tool_calls[0].function.arguments)
    schema = {"type": "object", "properties": {"k": {"enum": ["a", "b"]}}, "required": ["k"],
              "additionalProperties": False}
    answers = [client.chat.completions.create(model=name, messages=LONG, max_tokens=20, seed=1, response_format={
        "type": "json_schema", "json_schema": {"name": "k", "schema": schema}}).choices[0].message.content
        for name in ("local", "always")]
    assert answers[0] == answers[1] and json.loads(answers[1])["k"] in ("a", "b")


def test_a_thinking_peers_reasoning_passes_through(edge: LiveServer) -> None:
    """The peer splits its answer's <think> part (its reasoning parser); the edge, with none of its own,
    passes that reasoning on in the whole answer and in the stream. Oracle: the local model's raw answer
    (same weights, greedy, the same regex constraint) cut at its tags."""
    import re

    pattern = r"<think>[a-z ]{4,14}</think>\n\n[a-z ]{3,12}"
    ask = dict(messages=LONG, temperature=0, max_tokens=40, extra_body={"structured_outputs": {"regex": pattern}})
    client = _client(edge)
    raw = client.chat.completions.create(model="local", **ask).choices[0].message.content
    thought, answer = re.fullmatch(r"<think>(.*?)</think>(.*)", raw, re.S).groups()
    message = client.chat.completions.create(model="thinking-peer", **ask).choices[0].message
    assert (message.model_extra["reasoning_content"], message.model_extra["reasoning"]) == (thought, thought)
    assert message.content == answer
    reasoning, content = [], []
    for event in client.chat.completions.create(model="thinking-peer", stream=True, **ask):
        for choice in event.choices:
            reasoning.append((choice.delta.model_extra or {}).get("reasoning") or "")
            content.append(choice.delta.content or "")
    assert ("".join(reasoning), "".join(content)) == (thought, answer)


def test_a_responses_request_goes_to_the_cloud_as_chat(edge: LiveServer) -> None:
    """The Responses API runs through the chat path, so a [cloud] model forwards it as a chat request; the
    peer's answer (same weights) equals the local model's."""
    client = _client(edge)
    local = client.responses.create(model="local", input=LONG[0]["content"], max_output_tokens=12, temperature=0)
    remote = client.responses.create(model="always", input=LONG[0]["content"], max_output_tokens=12, temperature=0)
    assert remote.output_text == local.output_text and remote.status == local.status
    streamed = list(client.responses.create(model="always", input=LONG[0]["content"], max_output_tokens=12,
                                            temperature=0, stream=True))
    assert "".join(e.delta for e in streamed if e.type == "response.output_text.delta") == local.output_text
    assert streamed[-1].type == f"response.{local.status}"
