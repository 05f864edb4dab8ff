"""The generation routes through real clients: the official ``openai`` package and raw HTTP."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from generation_fixtures import LiveServer, base_url, served_repository

MESSAGES = [{"role": "system", "content": "You are a phone agent."},
            {"role": "user", "content": "open the settings menu then scroll down"}]
# a 1x1 PNG: a text-only model must refuse it before decoding anything
PIXEL_PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
IMAGE_MESSAGES = [MESSAGES[0], {"role": "user", "content": [
    {"type": "text", "text": "what is on the screen?"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PIXEL_PNG, "detail": "auto"}}]}]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, qwen_folder: Path) -> Path:
    import onnx

    from edge_runtime.model_zoo import build_mlp

    root = tmp_path_factory.mktemp("gen-repository")
    shutil.copytree(qwen_folder, root / "chat" / "1")
    shutil.copytree(qwen_folder, root / "busy" / "1")
    (root / "busy" / "config.toml").write_text("[generation]\nmax_queue = 0\n")
    (root / "mlp" / "1").mkdir(parents=True)
    onnx.save(build_mlp(), str(root / "mlp" / "1" / "model.onnx"))
    (root / "mlp" / "config.toml").write_text('[serving]\nbackend = "cpu"\n')
    return root


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with served_repository(repository, tmp_path_factory.mktemp("cache")) as live:
        yield live


def local_model(server: LiveServer) -> Any:
    from edge_runtime.server.state import STATE

    return server.app[STATE].repository.get("chat").model


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Any:
    import openai

    return openai.OpenAI(base_url=base_url(server) + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_openai_client_chat_equals_the_embedded_api(server: LiveServer, client: Any) -> None:
    expected = local_model(server).generate(messages=MESSAGES, max_tokens=20)
    response = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=20, temperature=0)
    assert response.choices[0].message.content == expected.text
    assert response.choices[0].finish_reason == expected.finish_reason
    assert response.usage.prompt_tokens == expected.usage.prompt_tokens
    assert response.usage.completion_tokens == expected.usage.completion_tokens
    assert response.object == "chat.completion" and response.model == "chat"


def test_openai_client_streaming_concatenates_and_reports_usage(client: Any) -> None:
    whole = client.chat.completions.create(model="chat", messages=MESSAGES, max_completion_tokens=30, temperature=0)
    stream = client.chat.completions.create(model="chat", messages=MESSAGES, max_completion_tokens=30,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_async_openai_client_concurrent_requests(server: LiveServer) -> None:
    import openai

    prompts = ["tap", "open close swipe left right home back", "the agent reads the screen"]

    async def main() -> list[str]:
        client = openai.AsyncOpenAI(base_url=base_url(server) + "/v1", api_key="unused", max_retries=0)
        try:
            answers = await asyncio.gather(*(client.completions.create(
                model="chat", prompt=p, max_tokens=8 + 4 * i, temperature=0) for i, p in enumerate(prompts)))
        finally:
            await client.close()
        return [a.choices[0].text for a in answers]

    texts = asyncio.run(main())
    model = local_model(server)
    assert texts == [model.generate(p, max_tokens=8 + 4 * i).text for i, p in enumerate(prompts)]


def test_completions_echo_logprobs_and_models(client: Any) -> None:
    response = client.completions.create(model="chat", prompt="the agent", max_tokens=5, temperature=0, echo=True,
                                         logprobs=2)
    choice = response.choices[0]
    assert choice.text.startswith("the agent")
    # echoed, the prompt's tokens are scored too (OpenAI's legacy completions, vLLM): the first one unscored
    usage = response.usage
    assert len(choice.logprobs.token_logprobs) == usage.prompt_tokens + usage.completion_tokens
    assert choice.logprobs.token_logprobs[0] is None and all(lp <= 0 for lp in choice.logprobs.token_logprobs[1:])
    assert "".join(choice.logprobs.tokens) == choice.text
    assert {m.id for m in client.models.list().data} == {"busy", "chat"}  # mlp is a tensor model


def test_chat_logprobs_match_the_model(server: LiveServer, client: Any) -> None:
    response = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=3, temperature=0,
                                              logprobs=True, top_logprobs=2)
    content = response.choices[0].logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 2 for c in content)
    assert content[0].top_logprobs[0].logprob == pytest.approx(content[0].logprob)  # greedy took the best


def test_logit_bias_over_http_forces_and_bans_tokens(server: LiveServer, client: Any) -> None:
    """OpenAI's JSON keys are strings: the same biases through the embedded API (int keys) are the oracle."""
    model = local_model(server)
    greedy = model.generate(messages=MESSAGES, max_tokens=4)
    forced_alone = model.generate(messages=MESSAGES, max_tokens=4, logit_bias={101: 100})
    assert set(forced_alone.token_ids) == {101}
    forced = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=4, temperature=0,
                                            logit_bias={"101": 100})
    assert forced.choices[0].message.content == forced_alone.text
    ban = set(greedy.token_ids)
    banned_alone = model.generate(messages=MESSAGES, max_tokens=4, logit_bias={t: -100 for t in ban})
    assert not set(banned_alone.token_ids) & ban
    banned = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=4, temperature=0,
                                            logit_bias={str(t): -100 for t in ban})
    assert banned.choices[0].message.content == banned_alone.text != greedy.text


def test_vllm_stop_token_ids_and_min_tokens_over_http_equal_the_embedded_api(server: LiveServer,
                                                                           client: Any) -> None:
    model = local_model(server)
    tokens = list(model.generate(messages=MESSAGES, max_tokens=12, ignore_eos=True).token_ids)
    for extra in ({"stop_token_ids": [tokens[2]]}, {"stop_token_ids": [tokens[2]], "min_tokens": 5}):
        alone = model.generate(messages=MESSAGES, max_tokens=12, ignore_eos=True, **extra)
        answer = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=12, temperature=0,
                                                extra_body={"ignore_eos": True, **extra})
        assert answer.choices[0].message.content == alone.text
        assert answer.usage.completion_tokens == len(alone.token_ids)
        assert answer.choices[0].finish_reason == alone.finish_reason


def test_vllm_truncate_prompt_tokens_keeps_the_prompt_s_last_tokens(server: LiveServer, client: Any) -> None:
    """vLLM's left truncation: the answer equals the embedded API's on the prompt's last k token ids;
    -1 keeps what the context holds (here all of it)."""
    model = local_model(server)
    ids = model.prepare(messages=MESSAGES).ids
    alone = model.generate(ids[-6:], max_tokens=8, ignore_eos=True)
    answer = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=8, temperature=0,
                                            extra_body={"ignore_eos": True, "truncate_prompt_tokens": 6})
    assert answer.usage.prompt_tokens == 6 and answer.choices[0].message.content == alone.text
    whole = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True, "truncate_prompt_tokens": -1})
    assert whole.usage.prompt_tokens == len(ids) > 6


def test_vllm_output_fields_over_http_equal_the_embedded_api(server: LiveServer, client: Any) -> None:
    model = local_model(server)
    greedy = model.generate(messages=MESSAGES, max_tokens=16, ignore_eos=True)
    stop = greedy.text[4:7]
    extra = {"ignore_eos": True, "include_stop_str_in_output": True, "skip_special_tokens": False}
    alone = model.generate(messages=MESSAGES, max_tokens=16, stop=[stop], **extra)
    answer = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=16, temperature=0,
                                            stop=[stop], extra_body=extra)
    assert answer.choices[0].message.content == alone.text and alone.text.endswith(stop)


def test_vllm_chat_rendering_fields_over_http_equal_the_embedded_api(server: LiveServer, client: Any) -> None:
    """``continue_final_message`` (an assistant message the model goes on with, agents' prefilled action)
    and ``chat_template_kwargs``, as vLLM takes them, streamed and not."""
    model = local_model(server)
    opened = [*MESSAGES, {"role": "assistant", "content": "do(action=\"Tap\", element=["}]
    extra = {"continue_final_message": True, "add_generation_prompt": False, "chat_template_kwargs": {"x": 1}}
    alone = model.generate(messages=opened, max_tokens=8, ignore_eos=True, **extra)
    answer = client.chat.completions.create(model="chat", messages=opened, max_tokens=8, temperature=0,
                                            extra_body={"ignore_eos": True, **extra})
    assert answer.choices[0].message.content == alone.text
    assert answer.usage.prompt_tokens == alone.usage.prompt_tokens < model.generate(
        messages=opened, max_tokens=1).usage.prompt_tokens  # no end of turn, no new assistant turn
    stream = client.chat.completions.create(model="chat", messages=opened, max_tokens=8, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True, **extra})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == alone.text


def test_openai_shaped_errors(client: Any) -> None:
    import openai

    cases = [
        (openai.NotFoundError, dict(model="nope", messages=MESSAGES), "unknown model"),
        (openai.BadRequestError, dict(model="chat", messages=[{"role": "robot", "content": "x"}]), "role"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, temperature=5), "temperature"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, n=0), "'n' must be an integer from 1 to 128"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, n=129), "'n' must be an integer from 1 to 128"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, n=100),
         "'n' (100) is more choices than chat can hold at once (max_batch_size 8 + max_queue 64)"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, logit_bias={"tap": 1}),
         "'logit_bias' keys must be token ids, got 'tap'"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, logit_bias={"7": 101}),
         "'logit_bias[7]' must be a number in [-100, 100], got 101"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, logit_bias={"99999999": 1}),
         "'logit_bias' token id 99999999 is outside the vocabulary"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, extra_body={"top_k": -2}), "'top_k' must be"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, extra_body={"min_p": 2}),
         "'min_p' must be a number in [0, 1], got 2"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, extra_body={"repetition_penalty": 0}),
         "'repetition_penalty' must be in (0, 2], got 0"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, max_tokens=3, extra_body={"min_tokens": 5}),
         "'min_tokens' (5) must not exceed 'max_tokens' (3)"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, extra_body={"stop_token_ids": 7}),
         "'stop_token_ids' must be a list of token ids, got 7"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, stream=True,
                                      stream_options={"continuous_usage_stats": True}),
         "'stream_options.continuous_usage_stats' is not supported"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, extra_body={"use_beam_search": True}),
         "'use_beam_search' is not supported by this server (got True)"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, extra_body={"truncate_prompt_tokens": 0}),
         "'truncate_prompt_tokens' must be an integer >= 1, or -1 for the model's context, got 0"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, extra_body={"truncate_prompt_tokens": 257}),
         "'truncate_prompt_tokens' (257) is more than chat's context of 256 tokens"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, extra_body={"prompt_logprobs": 21}),
         "'prompt_logprobs' must be an integer in [0, 20] or null, got 21"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, extra_body={"use_beam_search": True}),
         "'use_beam_search' is not supported by this server (got True)"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, extra_body={"best_of": 3}),
         "'best_of' is not supported: give 'n' choices instead (got best_of 3, n 1)"),
        # OpenAI fields whose meaning cannot be honoured here: named, never ignored
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, functions=[
            {"name": "tap", "parameters": {"type": "object"}}]), "'functions': OpenAI's deprecated function calling"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, modalities=["text", "audio"]),
         "'modalities' may only ask for text output here"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, web_search_options={}),
         "'web_search_options': web search is not available"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, extra_body={"skip_special_tokens": "no"}),
         "'skip_special_tokens' must be true or false, got 'no'"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, extra_body={"continue_final_message": True}),
         "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES,
                                      extra_body={"chat_template_kwargs": {"add_generation_prompt": False}}),
         "'chat_template_kwargs' may not set ['add_generation_prompt']"),
        (openai.BadRequestError, dict(model="mlp", messages=MESSAGES), "tensor model"),
        (openai.BadRequestError, dict(model="chat", messages=[{"role": "user", "content": "tap " * 300}]),
         "context is 256 tokens"),
        (openai.BadRequestError, dict(model="chat", messages=MESSAGES, max_tokens=0), "max_tokens"),
        (openai.RateLimitError, dict(model="busy", messages=MESSAGES), "queue full"),
        # a screenshot for a text-only model: vLLM's wording, which agent clients match to strip images
        (openai.BadRequestError, dict(model="chat", messages=IMAGE_MESSAGES), "chat is not a multimodal model"),
        (openai.BadRequestError, dict(model="chat", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": "data:image/png;base64,AAAA"}]}]),
         "messages[0].content[0].image_url must be an object"),
    ]
    for error, kwargs, text in cases:
        with pytest.raises(error) as caught:
            client.chat.completions.create(**kwargs)
        body = caught.value.body
        assert isinstance(body, dict) and text in body["message"], (kwargs, body)
        assert {"message", "type", "param", "code"} <= set(body)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="busy", messages=MESSAGES)
    assert caught.value.response.headers["Retry-After"]


async def _post(server: LiveServer, path: str, body: Any, **kwargs: Any) -> tuple[int, Any, dict]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.post(base_url(server) + path, json=body, **kwargs) as response:
            return response.status, await response.text(), dict(response.headers)


def test_n_choices_equal_each_seeded_choice_alone(server: LiveServer, client: Any) -> None:
    """``n`` choices are ``n`` sequences; with a seed, choice ``i`` samples as a request of its own with
    ``seed + i`` (the embedded API, one request at a time, is the oracle), whole, streamed and as a task."""
    model = local_model(server)
    alone = [model.generate(messages=MESSAGES, max_tokens=16, temperature=1.0, seed=7 + i) for i in range(3)]
    texts = [a.text for a in alone]
    assert len(set(texts)) > 1  # seeded differently, so the check below can tell the choices apart
    whole = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=16, temperature=1.0,
                                           seed=7, n=3)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert [c.message.content for c in whole.choices] == texts
    assert [c.finish_reason for c in whole.choices] == [a.finish_reason for a in alone]
    assert whole.usage.prompt_tokens == alone[0].usage.prompt_tokens  # the prompt counted once
    assert whole.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)

    stream = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=16, temperature=1.0,
                                            seed=7, n=3, stream=True, stream_options={"include_usage": True})
    pieces: dict[int, list[str]] = {0: [], 1: [], 2: []}
    roles, reasons = [], {}
    chunks = list(stream)
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.index)
            pieces[choice.index].append(choice.delta.content or "")
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
    assert sorted(roles) == [0, 1, 2] and ["".join(pieces[i]) for i in range(3)] == texts
    assert reasons == {i: a.finish_reason for i, a in enumerate(alone)}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens

    completions = client.completions.create(model="chat", prompt="the agent reads", max_tokens=8, temperature=1.0,
                                            seed=3, n=2, echo=True)
    assert [c.text for c in completions.choices] == [
        "the agent reads" + model.generate("the agent reads", max_tokens=8, temperature=1.0, seed=3 + i).text
        for i in range(2)]

    status, text, headers = asyncio.run(_post(server, "/v1/chat/completions", {
        "model": "chat", "messages": MESSAGES, "max_tokens": 16, "temperature": 1.0, "seed": 7, "n": 3,
        "async": True}))
    assert status == 202
    task = _finished_task(server, headers["Location"])
    assert [c["message"]["content"] for c in task["response"]["choices"]] == texts


def test_the_other_choices_read_the_first_choice_s_prompt_from_the_prefix_cache(server: LiveServer,
                                                                                 client: Any) -> None:
    import urllib.request

    def saved() -> float:
        with urllib.request.urlopen(base_url(server) + "/metrics") as response:
            lines = response.read().decode().splitlines()
        found = [line for line in lines if line.startswith('edge_runtime_prefix_cache_saved_tokens_total{model="chat"}')]
        return float(found[0].split()[-1]) if found else 0.0

    def fresh(word: str) -> list[dict[str, str]]:  # a prompt no earlier request had
        return [{"role": "system", "content": f"You are a phone agent; {word} the screen, then swipe left."},
                MESSAGES[1]]

    before = saved()
    client.chat.completions.create(model="chat", messages=fresh("scan"), max_tokens=2, temperature=0)
    assert saved() == before  # a new prompt alone: nothing from the cache
    client.chat.completions.create(model="chat", messages=fresh("read"), max_tokens=2, temperature=0, n=3)
    assert saved() > before  # choices 1 and 2 found choice 0's prompt


def test_greedy_n_choices_are_the_same_answer(client: Any) -> None:
    whole = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=12, temperature=0, n=2)
    one = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=12, temperature=0)
    assert [c.message.content for c in whole.choices] == [one.choices[0].message.content] * 2


def _finished_task(server: LiveServer, location: str) -> dict[str, Any]:
    """The task at ``location`` once it is no longer pending (polled for up to 30 s)."""
    import urllib.request

    for _ in range(600):
        with urllib.request.urlopen(base_url(server) + location) as response:
            task = json.loads(response.read())
        if task["status"] != "pending":
            break
        time.sleep(0.05)
    return task


def test_triton_generate_and_generate_stream(server: LiveServer) -> None:
    expected = local_model(server).generate("the agent taps", max_tokens=12).text
    status, text, _ = asyncio.run(_post(server, "/v2/models/chat/generate",
                                        {"text_input": "the agent taps", "parameters": {"max_tokens": 12,
                                                                                        "temperature": 0}}))
    assert status == 200 and json.loads(text) == {"model_name": "chat", "model_version": "1", "text_output": expected}
    status, text, headers = asyncio.run(_post(server, "/v2/models/chat/versions/1/generate_stream",
                                              {"text_input": "the agent taps", "max_tokens": 12, "temperature": 0}))
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]
    assert "".join(e["text_output"] for e in events) == expected and events[-1]["finish_reason"]
    status, text, _ = asyncio.run(_post(server, "/v2/models/chat/generate", {"parameters": {}}))
    assert status == 400 and "text_input" in json.loads(text)["error"]


def test_triton_generate_honours_a_constraint(server: LiveServer) -> None:
    """``structured_outputs`` / ``response_format`` on Triton's generate routes constrain the text as on
    ``/v1/completions`` (they were once parsed and then dropped: free text, silently). Oracle: the
    embedded API with the same constraint."""
    choice = {"structured_outputs": {"choice": ["tap the home button", "scroll down", "go back"]}}
    expected = local_model(server).generate("the agent taps", max_tokens=12, **choice).text
    assert expected in choice["structured_outputs"]["choice"]
    status, text, _ = asyncio.run(_post(server, "/v2/models/chat/generate", {
        "text_input": "the agent taps", "parameters": {"max_tokens": 12, "temperature": 0, **choice}}))
    assert status == 200 and json.loads(text)["text_output"] == expected
    regex = {"structured_outputs": {"regex": "[0-9]{3}"}}
    status, text, _ = asyncio.run(_post(server, "/v2/models/chat/generate_stream", {
        "text_input": "the agent taps", "max_tokens": 12, "temperature": 0, **regex}))
    events = [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]
    streamed = "".join(e["text_output"] for e in events)
    assert status == 200 and streamed == local_model(server).generate("the agent taps", max_tokens=12, **regex).text
    assert len(streamed) == 3 and streamed.isdigit()
    status, text, _ = asyncio.run(_post(server, "/v2/models/chat/generate", {
        "text_input": "x", "structured_outputs": {"regex": "("}}))
    assert status == 400 and "regex" in text
    for field in ({"n": 2}, {"echo": True}, {"logprobs": 2}, {"prompt_logprobs": 1}):
        status, text, _ = asyncio.run(_post(server, "/v2/models/chat/generate", {"text_input": "x", **field}))
        assert status == 400 and "cannot be answered as one text output" in text, (field, text)
    # vLLM's truncate_prompt_tokens is honoured: the prompt's last tokens only
    long_prompt = "the agent taps " * 20
    kept = local_model(server).tokenizer.encode_prompt(long_prompt)[-8:]
    status, text, _ = asyncio.run(_post(server, "/v2/models/chat/generate", {
        "text_input": long_prompt, "max_tokens": 6, "temperature": 0, "truncate_prompt_tokens": 8}))
    assert status == 200 and json.loads(text)["text_output"] == local_model(server).generate(kept, max_tokens=6).text


def test_async_request_is_polled_through_the_task_api(server: LiveServer) -> None:
    expected = local_model(server).generate(messages=MESSAGES, max_tokens=10).text
    status, text, headers = asyncio.run(_post(server, "/v1/chat/completions", {
        "model": "chat", "messages": MESSAGES, "max_tokens": 10, "temperature": 0, "async": True}))
    assert status == 202
    task = json.loads(text)
    task = _finished_task(server, headers["Location"])
    assert task["status"] == "succeeded", task
    assert task["response"]["choices"][0]["message"]["content"] == expected
    status, text, headers = asyncio.run(_post(server, "/v2/models/chat/generate", {
        "text_input": "the agent taps", "parameters": {"max_tokens": 6, "temperature": 0, "async": True}}))
    assert status == 202
    task = _finished_task(server, headers["Location"])
    assert task["response"]["text_output"] == local_model(server).generate("the agent taps", max_tokens=6).text


@pytest.mark.parametrize("route,n", [("completions", 1), ("completions", 3), ("responses", 1)])
def test_disconnect_cancels_the_sequence(server: LiveServer, route: str, n: int,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that leaves mid-stream: every choice's sequence is cancelled and leaves the batch before its
    answer's end. Judged by each sequence's finish reason, not by a token count: how many tokens a tiny
    model decodes before the server sees the socket close depends on the host (a CI run decoded 324 for
    three choices, ~10,500 tokens/s)."""
    import aiohttp

    model = local_model(server)
    before = model.batcher.stats().tokens_generated
    cancelled = []
    cancel = model.batcher.cancel
    monkeypatch.setattr(model.batcher, "cancel", lambda sequence: (cancelled.append(sequence), cancel(sequence)))

    async def hang_up() -> int:
        async with aiohttp.ClientSession() as session:
            body = {"model": "chat", "prompt": "tap", "max_tokens": 240, "ignore_eos": True, "stream": True,
                    "temperature": 0, "n": n} if route == "completions" else {
                    "model": "chat", "input": "tap", "max_output_tokens": 240, "ignore_eos": True, "stream": True,
                    "temperature": 0}  # the Responses API's stream: the same cancellation underneath
            async with session.post(base_url(server) + f"/v1/{route}", json=body) as response:
                await response.content.readline()  # the stream started: leave mid-way
                return response.status

    assert asyncio.run(hang_up()) == 200
    for _ in range(400):
        if model.batcher.pending == 0:
            break
        time.sleep(0.025)
    assert model.batcher.pending == 0  # every choice's sequence left
    assert len(cancelled) == n and all(s.finish_reason == "cancelled" for s in cancelled), \
        [s.finish_reason for s in cancelled]  # told to leave, and left before its 240th token ("length")
    assert model.batcher.stats().tokens_generated - before < n * 240


def test_metrics_report_prefix_cache_hits(server: LiveServer, client: Any) -> None:
    import urllib.request

    for _ in range(2):
        client.chat.completions.create(model="chat", messages=MESSAGES + [{"role": "user", "content": "again"}],
                                       max_tokens=2, temperature=0)
    with urllib.request.urlopen(base_url(server) + "/metrics") as response:
        text = response.read().decode()
    hits = [line for line in text.splitlines() if line.startswith('edge_runtime_prefix_cache_saved_tokens_total{model="chat"}')]
    assert hits and float(hits[0].split()[-1]) > 0
    assert 'edge_runtime_generation_sequences{model="chat",state="running"} 0.0' in text


def test_vllm_tokenize_and_detokenize(server: LiveServer, qwen_folder: Path) -> None:
    """``/tokenize`` gives the ids a request would prefill (transformers' tokenizer and chat template are
    the oracle of those, see test_generation_greedy), usage agrees with its count, ``/detokenize`` turns
    ids back into text; bad bodies are named 400s."""
    import json as json_module

    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(qwen_folder)
    model = local_model(server)
    prompt = "the agent taps the button"
    status, text, _ = asyncio.run(_post(server, "/tokenize", {"model": "chat", "prompt": prompt,
                                                               "return_token_strs": True}))
    answer = json_module.loads(text)
    assert status == 200 and answer["tokens"] == hf(prompt)["input_ids"]
    assert answer["count"] == len(answer["tokens"]) and answer["max_model_len"] == model.context_length
    assert answer["token_strs"] == hf.convert_ids_to_tokens(answer["tokens"])
    opened = [*MESSAGES, {"role": "assistant", "content": "do(action="}]
    for body, expected in (
            ({"messages": MESSAGES}, hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)),
            ({"messages": opened, "continue_final_message": True, "add_generation_prompt": False},
             hf.apply_chat_template(opened, continue_final_message=True, tokenize=False))):
        status, text, _ = asyncio.run(_post(server, "/tokenize", {"model": "chat", **body}))
        tokens = json_module.loads(text)["tokens"]
        assert status == 200 and tokens == hf(expected, add_special_tokens=False)["input_ids"]
        assert len(tokens) == model.generate(messages=body["messages"], max_tokens=1, **{
            k: v for k, v in body.items() if k != "messages"}).usage.prompt_tokens
    status, text, _ = asyncio.run(_post(server, "/detokenize", {"model": "chat", "tokens": tokens}))
    assert status == 200 and json_module.loads(text)["prompt"] == hf.decode(tokens, skip_special_tokens=False)
    for path, body, message in (
            ("/tokenize", {"model": "chat"}, "give exactly one of 'prompt' (a string) and 'messages'"),
            ("/tokenize", {"prompt": "x"}, "'model' must name a served model"),
            ("/tokenize", {"model": "chat", "prompt": "x", "add_special_tokens": "yes"},
             "'add_special_tokens' must be true or false"),
            ("/detokenize", {"model": "chat", "tokens": [1, -3]}, "'tokens' must be a list of token ids in [0, "),
            ("/tokenize", {"model": "mlp", "prompt": "x"}, "tensor model"),
            ("/tokenize", {"model": "chat", "messages": IMAGE_MESSAGES}, "chat is not a multimodal model")):
        status, text, _ = asyncio.run(_post(server, path, body))
        assert status == 400 and message in json_module.loads(text)["error"]["message"], (path, body, text)
