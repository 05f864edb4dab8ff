"""OpenAI's Responses API (``POST /v1/responses``) with the real ``openai`` client: ``responses.create``,
streamed, and the SDK's own ``responses.stream`` helper, whose accumulator checks the event protocol
(items opened before their deltas, identities kept, a terminal event).

Oracle: the same request through ``/v1/chat/completions`` (greedy, the same weights), which the
chat tests hold to the embedded API and transformers; a Responses answer must be the same text,
calls and token counts.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import numpy as np
import pytest

from generation_fixtures import LiveServer, openai_client, served_repository

SYSTEM = "You are a phone agent."
ASK = "open the settings menu then tap ok"
TAP = {"type": "function", "name": "tap", "description": "tap the screen", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 1080},
                                     "y": {"type": "integer", "minimum": 0, "maximum": 2400}},
    "required": ["x", "y"], "additionalProperties": False}}
CHAT_TAP = {"type": "function", "function": {k: v for k, v in TAP.items() if k != "type"}}
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>"
    "<tool_call><|im_end|>\n{%- endif %}{%- for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{%- if message['content'] %}{{ message['content'] }}{%- endif %}"
    "{%- for call in message.get('tool_calls') or [] %}<tool_call>{{ call['function'] | tojson }}</tool_call>"
    "{%- endfor %}<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- endif %}")


def _png_url(seed: int) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (84, 112, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, qwen_folder: Path) -> Iterator[LiveServer]:
    from hf_decoders import optimum_folder

    from edge_runtime.vlm_zoo import write_vlm_folder
    from generation_fixtures import SPECS, models_root

    root = tmp_path_factory.mktemp("responses-repository")
    shutil.copytree(qwen_folder, root / "chat" / "1")
    long_context = optimum_folder(replace(SPECS["qwen2"], max_positions=1024), models_root())
    shutil.copytree(long_context, root / "hermes" / "1")
    (root / "hermes" / "1" / "chat_template.jinja").write_text(HERMES_TEMPLATE)
    shutil.copytree(qwen_folder, root / "thinker" / "1")
    (root / "thinker" / "config.toml").write_text('[generation]\nreasoning_parser = "qwen3"\n'
                                                  'structured_in_reasoning = true\n')
    write_vlm_folder(root / "agent" / "1", "qwen2_vl", seed=1)
    (root / "agent" / "config.toml").write_text('[vision]\nplan = "cpu"\n')
    with served_repository(root, tmp_path_factory.mktemp("cache")) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Any:
    return openai_client(server)


def _chat(client: Any, model: str, messages: list[dict[str, Any]], **fields: Any) -> Any:
    fields.setdefault("max_tokens", 16)
    return client.chat.completions.create(model=model, messages=messages, temperature=0, **fields)


def test_text_equals_the_chat_answer(client: Any) -> None:
    chat = _chat(client, "chat", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}])
    response = client.responses.create(model="chat", instructions=SYSTEM, input=ASK, max_output_tokens=16,
                                       temperature=0)
    status = "incomplete" if chat.choices[0].finish_reason == "length" else "completed"
    assert response.status == status and response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == chat.choices[0].message.content
    assert [item.type for item in response.output] == ["message"]
    assert (response.usage.input_tokens, response.usage.output_tokens) == (chat.usage.prompt_tokens,
                                                                         chat.usage.completion_tokens)
    parts = client.responses.create(model="chat", max_output_tokens=16, temperature=0, input=[
        {"role": "system", "content": SYSTEM},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]}])
    assert parts.output_text == response.output_text


def test_streamed_events_follow_the_protocol_and_equal_the_whole(client: Any) -> None:
    # a short free-text pattern, so the answer completes (the SDK's helper finalizes on response.completed)
    ends = {"structured_outputs": {"regex": "[a-z ]{4,24}"}}
    whole = client.responses.create(model="chat", input=ASK, max_output_tokens=40, temperature=0, extra_body=ends)
    assert whole.status == "completed"
    with client.responses.stream(model="chat", input=ASK, max_output_tokens=40, temperature=0,
                                 extra_body=ends) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == whole.output_text and final.id == events[0].response.id
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_max_output_tokens_leaves_it_incomplete(client: Any) -> None:
    response = client.responses.create(model="chat", input=ASK, max_output_tokens=3, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    events = list(client.responses.create(model="chat", input=ASK, max_output_tokens=3, temperature=0, stream=True,
                                          extra_body={"ignore_eos": True}))
    assert events[-1].type == "response.incomplete" and events[-1].response.output[0].content[0].text \
        == response.output_text


def test_function_calls_equal_chat_tool_calls(client: Any) -> None:
    messages = [{"role": "user", "content": ASK}]
    chat = _chat(client, "hermes", messages, tools=[CHAT_TAP], tool_choice="required", max_tokens=60)
    expected = [(c.function.name, c.function.arguments) for c in chat.choices[0].message.tool_calls]
    response = client.responses.create(model="hermes", input=ASK, tools=[TAP], tool_choice="required",
                                       max_output_tokens=60, temperature=0)
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == expected
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), TAP["parameters"])
        assert call.call_id.startswith("call_") and call.status == "completed"
    with client.responses.stream(model="hermes", input=ASK, tools=[TAP], tool_choice="required",
                                 max_output_tokens=60, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [(i.name, i.arguments) for i in final.output if i.type == "function_call"] == expected
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == \
        "".join(arguments for _, arguments in expected)


def test_a_function_call_round_trip_renders_as_chat_does(client: Any) -> None:
    """A function_call item and its function_call_output are the assistant's tool_calls and a tool message."""
    arguments = '{"x": 10, "y": 20}'
    chat = _chat(client, "hermes", [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "tap", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "tapped"}], tools=[CHAT_TAP])
    response = client.responses.create(model="hermes", tools=[TAP], max_output_tokens=16, temperature=0, input=[
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": "call_1", "name": "tap", "arguments": arguments},
        {"type": "function_call_output", "call_id": "call_1", "output": "tapped"}])
    assert response.output_text == (chat.choices[0].message.content or "")
    assert response.usage.input_tokens == chat.usage.prompt_tokens


def test_text_format_json_schema(client: Any) -> None:
    schema = {"type": "object", "properties": {"action": {"enum": ["tap", "back"]}, "x": {"type": "integer"}},
              "required": ["action", "x"], "additionalProperties": False}
    chat = _chat(client, "chat", [{"role": "user", "content": ASK}], max_tokens=40, response_format={
        "type": "json_schema", "json_schema": {"name": "act", "schema": schema, "strict": True}})
    response = client.responses.create(model="chat", input=ASK, max_output_tokens=40, temperature=0, text={
        "format": {"type": "json_schema", "name": "act", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.output_text == chat.choices[0].message.content


def test_reasoning_item_before_the_message(client: Any) -> None:
    pattern = r"<think>[a-z ]{4,14}</think>\n\n[a-z ]{3,12}"
    extra = {"structured_outputs": {"regex": pattern}}
    chat = _chat(client, "thinker", [{"role": "user", "content": ASK}], max_tokens=60, extra_body=extra)
    thought = chat.choices[0].message.model_extra["reasoning_content"]
    response = client.responses.create(model="thinker", input=ASK, max_output_tokens=60, temperature=0,
                                       extra_body=extra)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text == thought
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.output_tokens_details.reasoning_tokens > 0
    with client.responses.stream(model="thinker", input=ASK, max_output_tokens=60, temperature=0,
                                 extra_body=extra) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == thought
    assert final.output_text == response.output_text


def test_a_screenshot_as_input_image_equals_the_chat_image(client: Any) -> None:
    url = _png_url(3)
    chat = _chat(client, "agent", [{"role": "user", "content": [
        {"type": "text", "text": "What should I tap?"}, {"type": "image_url", "image_url": {"url": url}}]}])
    response = client.responses.create(model="agent", max_output_tokens=16, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "What should I tap?"},
                                     {"type": "input_image", "image_url": url, "detail": "auto"}]}])
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    # a request's own image budget (vLLM's mm_processor_kwargs) passes to the chat it becomes
    budget = {"mm_processor_kwargs": {"max_pixels": 28 * 28 * 4}}
    small_chat = _chat(client, "agent", [{"role": "user", "content": [
        {"type": "text", "text": "What should I tap?"}, {"type": "image_url", "image_url": {"url": url}}]}],
        extra_body=budget)
    small = client.responses.create(model="agent", max_output_tokens=16, temperature=0, extra_body=budget, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "What should I tap?"},
                                     {"type": "input_image", "image_url": url, "detail": "auto"}]}])
    assert small.usage.input_tokens == small_chat.usage.prompt_tokens < response.usage.input_tokens
    assert small.output_text == small_chat.choices[0].message.content


@pytest.mark.parametrize("fields,named", [
    ({"conversation": "conv_1"}, "conversation"),
    ({"store": "yes"}, "'store' must be true or false"),
    ({"tools": [{"type": "web_search"}]}, "only function tools"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     "input[0].content[0].image_url"),
    ({"input": []}, "'input'"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
])
def test_what_needs_state_or_is_not_built_is_a_named_400(client: Any, fields: dict[str, Any], named: str) -> None:
    import openai

    body = {"model": "chat", "input": ASK, **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(**body)
    assert named in str(caught.value)


def test_chat_takes_the_responses_part_types_as_vllm_does(client: Any) -> None:
    """vLLM's chat API reads input_text / input_image parts too: the same answer as text / image_url."""
    url = _png_url(5)
    standard = _chat(client, "agent", [{"role": "user", "content": [
        {"type": "text", "text": "What should I tap?"}, {"type": "image_url", "image_url": {"url": url}}]}])
    responses_style = _chat(client, "agent", [{"role": "user", "content": [
        {"type": "input_text", "text": "What should I tap?"}, {"type": "input_image", "image_url": url}]}])
    assert responses_style.choices[0].message.content == standard.choices[0].message.content
    assert responses_style.usage.prompt_tokens == standard.usage.prompt_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_previous_response_id_continues_the_stored_conversation(client: Any, stream: bool) -> None:
    """The second turn names the first instead of resending it: the answer of the chat request holding
    the whole conversation (the first turn's user message, its answer, the new message)."""
    if stream:  # stored at its terminal event (here response.incomplete: max_output_tokens cut it)
        events = list(client.responses.create(model="chat", input=ASK, max_output_tokens=8, temperature=0,
                                              stream=True))
        first = events[-1].response
        assert events[-1].type in ("response.completed", "response.incomplete")
    else:
        first = client.responses.create(model="chat", input=ASK, max_output_tokens=8, temperature=0)
    assert first.store is True and first.output_text
    follow = "and then scroll down"
    second = client.responses.create(model="chat", previous_response_id=first.id, input=follow,
                                     max_output_tokens=8, temperature=0)
    chat = _chat(client, "chat", [{"role": "user", "content": ASK},
                                  {"role": "assistant", "content": first.output_text},
                                  {"role": "user", "content": follow}], max_tokens=8)
    assert second.output_text == chat.choices[0].message.content
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.previous_response_id == first.id
    # a chain needs only its last link
    third = client.responses.create(model="chat", previous_response_id=second.id, input="ok", max_output_tokens=4,
                                    temperature=0)
    chat = _chat(client, "chat", [{"role": "user", "content": ASK},
                                  {"role": "assistant", "content": first.output_text},
                                  {"role": "user", "content": follow},
                                  {"role": "assistant", "content": second.output_text},
                                  {"role": "user", "content": "ok"}], max_tokens=4)
    assert third.output_text == chat.choices[0].message.content


def test_a_tool_round_trip_through_previous_response_id(client: Any) -> None:
    """The agent's loop without resending: the model's call, then only the call's output."""
    first = client.responses.create(model="hermes", tools=[TAP], tool_choice="required", input=ASK,
                                    max_output_tokens=60, temperature=0)
    call = next(item for item in first.output if item.type == "function_call")
    second = client.responses.create(model="hermes", tools=[TAP], previous_response_id=first.id,
                                     max_output_tokens=16, temperature=0,
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "tapped"}])
    chat = _chat(client, "hermes", [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "tapped"}], tools=[CHAT_TAP])
    assert second.output_text == (chat.choices[0].message.content or "")
    assert second.usage.input_tokens == chat.usage.prompt_tokens


def test_stored_responses_are_retrieved_listed_and_deleted(client: Any) -> None:
    import openai

    first = client.responses.create(model="chat", input=ASK, max_output_tokens=6, temperature=0,
                                    instructions=SYSTEM)
    second = client.responses.create(model="chat", previous_response_id=first.id, input="next",
                                     max_output_tokens=6, temperature=0)
    again = client.responses.retrieve(first.id)
    assert (again.id, again.output_text, again.status) == (first.id, first.output_text, first.status)
    items = list(client.responses.input_items.list(second.id, order="asc"))
    assert [getattr(item, "role", None) for item in items] == ["user", "assistant", "user"]  # no instructions
    assert all(item.id for item in items)
    assert client.responses.delete(first.id) is None
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.responses.create(model="chat", previous_response_id=first.id, input="x", max_output_tokens=2)
    assert client.responses.retrieve(second.id).previous_response_id == first.id  # its own record is whole
    unstored = client.responses.create(model="chat", input=ASK, max_output_tokens=2, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_the_store_keeps_the_most_recent_within_its_budget() -> None:
    from edge_runtime.server.errors import ResponseNotFoundError
    from edge_runtime.server.responses_store import ResponseStore

    def response(name: str, size: int) -> dict[str, Any]:
        return {"id": name, "output": [{"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "x" * size}]}]}

    store = ResponseStore(3000)
    for name in ("a", "b", "c"):
        assert store.put(response(name, 700), [{"type": "message", "role": "user", "content": name}])
    store.get("a")  # now the most recent: "b" goes first
    assert store.put(response("d", 700), [])
    with pytest.raises(ResponseNotFoundError):
        store.get("b")
    assert {store.get(n).response["id"] for n in ("a", "c", "d")} == {"a", "c", "d"}
    assert store.stats()["bytes"] <= 3000
    assert not store.put(response("huge", 5000), [])  # alone over the budget: not kept, nothing evicted
    assert store.stats()["entries"] == 3
    assert store.get("a").conversation[-1]["content"][0]["text"] == "x" * 700  # input, then output items
    with pytest.raises(ResponseNotFoundError, match="stores no responses"):
        ResponseStore(0).get("a")
