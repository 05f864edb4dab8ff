"""Structured output and tool calls (issue 25) on random-weight decoders, through the embedded API and
the ``openai`` client.

Unconstrained, a random-weight model never writes valid JSON (checked below, so the oracle can
fail); constrained, every answer sampled at temperature 1 must parse and validate with
``jsonschema``, the independent oracle of the schema's meaning.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import pytest

from generation_fixtures import LiveServer, openai_client, served_repository

MESSAGES = [{"role": "system", "content": "You are a phone agent."},
            {"role": "user", "content": "open the settings menu then tap ok"}]
ACTION_SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"enum": ["tap", "swipe", "type", "back"]},
        "target": {"type": "object", "properties": {
            "x": {"type": "integer", "minimum": 0, "maximum": 1080},
            "y": {"type": "integer", "minimum": -5, "maximum": 2400}},
            "required": ["x", "y"], "additionalProperties": False},
        "path": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                 "minItems": 1, "maxItems": 3},
        "label": {"type": "string", "maxLength": 6},
        "done": {"type": "boolean"},
    },
    "required": ["action", "target", "path"],
    "additionalProperties": False,
}
TAP = {"type": "function", "function": {"name": "tap", "description": "tap the screen", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 1080},
                                     "y": {"type": "integer", "minimum": 0, "maximum": 2400}},
    "required": ["x", "y"], "additionalProperties": False}}}
TYPE_TEXT = {"type": "function", "function": {"name": "type_text", "parameters": {
    "type": "object", "properties": {"text": {"type": "string", "maxLength": 8},
                                     "submit": {"type": "boolean"}},
    "required": ["text"], "additionalProperties": False}}}
TOOLS = [TAP, TYPE_TEXT]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
# A Qwen2.5-style template: tools listed in the system turn, calls in <tool_call> tags (so the
# model's tool parser defaults to hermes).
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}"
    "\n</tools>\nCall a tool as <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call><|im_end|>\n"
    "{%- endif %}{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- endif %}")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, qwen_folder: Path) -> Path:
    from dataclasses import replace

    from hf_decoders import optimum_folder

    from generation_fixtures import SPECS, models_root

    root = tmp_path_factory.mktemp("structured-repository")
    shutil.copytree(qwen_folder, root / "chat" / "1")
    # the tool list in the system turn needs a longer context than the shared model's 256 positions
    long_context = optimum_folder(replace(SPECS["qwen2"], max_positions=1024), models_root())
    shutil.copytree(long_context, root / "hermes" / "1")
    (root / "hermes" / "1" / "chat_template.jinja").write_text(HERMES_TEMPLATE)
    return root


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with served_repository(repository, tmp_path_factory.mktemp("cache")) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Any:
    return openai_client(server)


def local(server: LiveServer, name: str = "chat") -> Any:
    from edge_runtime.server.state import STATE

    return server.app[STATE].repository.get(name).model


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def test_every_sampled_json_schema_answer_validates(server: LiveServer) -> None:
    model = local(server)
    free = [model.generate(messages=MESSAGES, temperature=1.0, seed=s, max_tokens=60).text for s in range(4)]
    assert not any(isinstance(_json_or_none(t), dict) for t in free)  # unconstrained: never an object
    response_format = {"type": "json_schema", "json_schema": {"name": "action", "schema": ACTION_SCHEMA,
                                                              "strict": True}}
    optional_seen = set()
    for seed in range(16):
        result = model.generate(messages=MESSAGES, temperature=1.0, seed=seed, max_tokens=200,
                                response_format=response_format)
        assert result.finish_reason == "stop", result.text
        value = json.loads(result.text)
        jsonschema.validate(value, ACTION_SCHEMA)
        optional_seen |= set(value) - set(ACTION_SCHEMA["required"])
    assert optional_seen  # optional fields were written at least once, so they were reachable


def test_json_object_regex_and_choice(server: LiveServer, client: Any) -> None:
    # Free JSON lets a random model write strings of any length: an answer that ends within
    # max_tokens is an object; one cut at max_tokens says "length" and is not complete JSON.
    reasons = []
    for seed in range(8):
        answer = client.chat.completions.create(model="chat", messages=MESSAGES, seed=seed, max_tokens=160,
                                                response_format={"type": "json_object"}).choices[0]
        reasons.append(answer.finish_reason)
        if answer.finish_reason == "stop":
            assert isinstance(json.loads(answer.message.content), dict)
        else:
            assert answer.finish_reason == "length" and _json_or_none(answer.message.content) is None
    assert reasons.count("stop") >= 2, reasons
    pattern = r"do\(action=\"(Tap|Swipe)\", element=\[[0-9]{1,3}, [0-9]{1,3}\]\)"
    for seed in range(4):
        response = client.chat.completions.create(model="chat", messages=MESSAGES, seed=seed, max_tokens=40,
                                                  extra_body={"structured_outputs": {"regex": pattern}})
        assert re.fullmatch(pattern, response.choices[0].message.content)
    choices = ["yes", "no", "maybe later"]
    answers = {client.chat.completions.create(model="chat", messages=MESSAGES, seed=seed, max_tokens=10,
                                              extra_body={"structured_outputs": {"choice": choices}})
               .choices[0].message.content for seed in range(6)}
    assert answers <= set(choices)
    completion = client.completions.create(model="chat", prompt="the agent taps", max_tokens=40, seed=3,
                                           extra_body={"structured_outputs": {"regex": pattern}})
    assert re.fullmatch(pattern, completion.choices[0].text)


def test_grammar_constrains_as_told(client: Any) -> None:
    grammar = 'start: "swipe " DIR " " NUM\nDIR: "left" | "right"\nNUM: /[1-9][0-9]?/\n'
    for seed in range(3):
        text = client.chat.completions.create(model="chat", messages=MESSAGES, seed=seed, max_tokens=20,
                                              extra_body={"structured_outputs": {"grammar": grammar}}
                                              ).choices[0].message.content
        assert re.fullmatch(r"swipe (left|right) [1-9][0-9]?", text), text


@pytest.mark.parametrize("name", ["chat", "hermes"])
def test_required_and_named_tool_choice_give_valid_calls(client: Any, name: str) -> None:
    for seed in range(6):
        choice: Any = "required" if seed % 2 else {"type": "function", "function": {"name": "type_text"}}
        response = client.chat.completions.create(model=name, messages=MESSAGES, seed=seed, max_tokens=200,
                                                  tools=TOOLS, tool_choice=choice, parallel_tool_calls=seed < 3)
        answer = response.choices[0]
        assert answer.finish_reason == "tool_calls", answer
        calls = answer.message.tool_calls
        assert calls and (seed < 3 or len(calls) == 1)
        for call in calls:
            assert call.type == "function" and call.id
            jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])
            if choice != "required":
                assert call.function.name == "type_text"


def test_tools_are_rendered_by_the_chat_template(server: LiveServer) -> None:
    model = local(server, "hermes")
    assert model.tool_parser == "hermes" and local(server).tool_parser == "json"
    prepared = model.prepare(messages=MESSAGES, tools=TOOLS)
    assert '"name": "type_text"' in prepared.text and prepared.text.startswith("<|im_start|>system\n# Tools")
    result = model.generate(messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=200,
                            temperature=1.0, seed=5)
    assert result.finish_reason == "tool_calls" and result.text.startswith("<tool_call>\n")
    for call in result.tool_calls:
        jsonschema.validate(json.loads(call.arguments), PARAMETERS[call.name])


def test_auto_with_a_strict_tool_and_none(client: Any) -> None:
    strict = [{"type": "function", "function": {**TAP["function"], "strict": True}}, TYPE_TEXT]
    kinds = set()
    for seed in range(6):
        answer = client.chat.completions.create(model="hermes", messages=MESSAGES, seed=seed, max_tokens=60,
                                                tools=strict, tool_choice="auto").choices[0]
        if answer.message.tool_calls:  # a call, whole and valid; else text that never opened one
            kinds.add("call")
            assert answer.finish_reason == "tool_calls"
            for call in answer.message.tool_calls:
                jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])
        else:
            kinds.add("text")
            assert "<tool_call>" not in answer.message.content
    assert kinds
    answer = client.chat.completions.create(model="hermes", messages=MESSAGES, seed=0, max_tokens=20, tools=TOOLS,
                                            tool_choice="none").choices[0]
    assert answer.message.tool_calls is None and answer.finish_reason in ("stop", "length")


def test_earlier_tool_calls_reach_the_template_as_objects(server: LiveServer) -> None:
    from edge_runtime.generation.chat import ChatTokenizer

    tokenizer = ChatTokenizer(local(server, "hermes").path)
    tokenizer._template = tokenizer._compile(
        "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}"
        "{% endfor %}{% endfor %}")
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "tap", "arguments": '{"x": 1, "y": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    assert json.loads(tokenizer.render(history)) == {"x": 1, "y": 2}  # an object, not JSON text in a string


@pytest.mark.parametrize("name", ["chat", "hermes"])
def test_streamed_tool_call_deltas_assemble_to_the_whole_call(client: Any, name: str) -> None:
    kwargs = dict(model=name, messages=MESSAGES, max_tokens=200, tools=TOOLS, tool_choice="required", seed=11)
    whole = client.chat.completions.create(**kwargs).choices[0]
    calls: dict[int, dict[str, str]] = {}
    reasons, pieces = [], 0
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            reasons.append(choice.finish_reason)
            for delta in choice.delta.tool_calls or ():
                entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                if delta.function.name:
                    entry["name"] += delta.function.name
                entry["arguments"] += delta.function.arguments or ""
                pieces += bool(delta.function.arguments)
    assert reasons[-1] == whole.finish_reason == "tool_calls"
    assert pieces > len(calls)  # the arguments came as the model wrote them, not in one piece per call
    assert [calls[i] for i in sorted(calls)] == [
        {"name": c.function.name, "arguments": c.function.arguments} for c in whole.message.tool_calls]


def test_openai_parse_with_a_pydantic_model(client: Any) -> None:
    from typing import Literal

    from pydantic import BaseModel, Field

    class Point(BaseModel):
        x: int = Field(ge=0, le=1080)
        y: int = Field(ge=0, le=2400)

    class Action(BaseModel):
        action: Literal["tap", "swipe"]
        at: Point
        note: str = Field(max_length=5)

    completion = client.chat.completions.parse(model="chat", messages=MESSAGES, response_format=Action,
                                               max_tokens=200, seed=2)
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Action) and 0 <= parsed.at.x <= 1080


def test_concurrent_constrained_and_free_requests_equal_each_alone(server: LiveServer) -> None:
    model = local(server)
    regex = {"structured_outputs": {"regex": r"\[[0-9]{1,4}(, [0-9]{1,4}){2,5}\]"}}
    jobs = [dict(messages=MESSAGES, max_tokens=40),
            dict(messages=MESSAGES, max_tokens=120, response_format={"type": "json_schema", "json_schema": {
                "name": "a", "schema": ACTION_SCHEMA}}),
            dict(prompt="the agent reads the screen", max_tokens=30),
            dict(messages=MESSAGES[1:], max_tokens=40, **regex)]
    alone = [model.generate(**job).text for job in jobs]
    together: list[Any] = [None] * len(jobs)

    def run(i: int) -> None:
        together[i] = model.generate(**jobs[i]).text

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert together == alone
    jsonschema.validate(json.loads(alone[1]), ACTION_SCHEMA)


def test_a_schema_that_cannot_finish_ends_with_length(client: Any) -> None:
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer"},
                                                         "minItems": 40}}, "required": ["items"]}
    answer = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=12, seed=0,
                                            response_format={"type": "json_schema", "json_schema": {
                                                "name": "long", "schema": schema}}).choices[0]
    assert answer.finish_reason == "length"
    assert _json_or_none(answer.message.content) is None  # cut short: never a complete object


def test_bad_structured_input_is_a_400_naming_the_field(client: Any, server: LiveServer) -> None:
    import openai

    def schema_format(schema: Any) -> dict[str, Any]:
        return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}

    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "no-such-type"}}}}}
    cases = [
        (dict(response_format=schema_format({"type": "no-such-type"})), "response_format.json_schema.schema"),
        (dict(response_format=schema_format({"type": "string", "pattern": "(unclosed"})),
         "response_format.json_schema.schema"),
        (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "'name' and 'schema'"),
        (dict(response_format={"type": "yaml"}), "response_format.type"),
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "fly"}}),
         "tool_choice.function.name 'fly' is not among the tools ['tap', 'type_text']"),
        (dict(tool_choice="required"), "tool_choice 'required' needs 'tools'"),
        (dict(tools=[bad_tool], tool_choice="required"), "tools[0].function.parameters"),
        (dict(tools=[{"type": "function"}]), "tools[0] must be"),
        (dict(extra_body={"structured_outputs": {"regex": "(ab"}}), "structured_outputs.regex"),
        (dict(extra_body={"structured_outputs": {"grammar": "start: undefined_rule"}}),
         "structured_outputs.grammar"),
        (dict(extra_body={"structured_outputs": {"choice": []}}), "structured_outputs.choice"),
        (dict(extra_body={"structured_outputs": {"regex": "a", "choice": ["a"]}}), "give one of"),
        (dict(response_format={"type": "json_object"}, tools=TOOLS, tool_choice="required"),
         "cannot be combined with a forced tool_choice"),
    ]
    batcher = local(server).batcher
    steps = batcher.stats().steps
    for kwargs, text in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=5, **kwargs)
        assert text in caught.value.body["message"], (kwargs, caught.value.body)
    assert batcher.stats().steps == steps  # refused before any token was generated
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="chat", prompt="x", max_tokens=5,
                                  extra_body={"structured_outputs": {"json": "{not json"}})
    assert "structured_outputs.json is not valid JSON" in caught.value.body["message"]


def test_grammars_compile_once_and_cloud_bodies_keep_the_fields(server: LiveServer) -> None:
    from edge_runtime.generation.openai_params import parse_chat

    model = local(server)
    schema = {"type": "object", "properties": {"k": {"enum": ["a", "b"]}}, "required": ["k"]}
    before = model.grammars.compiles
    for seed in range(3):
        model.generate(messages=MESSAGES, max_tokens=20, temperature=1.0, seed=seed,
                       response_format={"type": "json_schema", "json_schema": {"name": "k", "schema": schema}})
    assert model.grammars.compiles == before + 1
    body = {"model": "m", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required",
            "parallel_tool_calls": False, "response_format": {"type": "text"},
            "structured_outputs": {"regex": "a+"}}
    forwarded = parse_chat({**body, "tool_choice": "auto"}).forward_body("remote")
    assert {k: forwarded[k] for k in ("tools", "parallel_tool_calls", "response_format", "structured_outputs")} == {
        k: body[k] for k in ("tools", "parallel_tool_calls", "response_format", "structured_outputs")}


def test_n_constrained_choices_each_follow_the_schema(server: LiveServer, client: Any) -> None:
    """Each choice has its own matcher: both sampled answers validate, and each equals its seed alone."""
    fmt = {"type": "json_schema", "json_schema": {"name": "action", "schema": ACTION_SCHEMA}}
    answer = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=120, temperature=1.0,
                                            seed=21, n=2, response_format=fmt)
    model = local(server)
    alone = [model.generate(messages=MESSAGES, max_tokens=120, temperature=1.0, seed=21 + i, response_format=fmt).text
             for i in range(2)]
    assert [c.message.content for c in answer.choices] == alone and alone[0] != alone[1]
    for text in alone:
        jsonschema.validate(json.loads(text), ACTION_SCHEMA)


def test_a_new_grammar_compiles_off_the_event_loop(server: LiveServer, client: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """While a new schema compiles (held here until the check is done), the server still answers
    another request with its tokens: the compile is not on the event loop. A compile run on the
    loop would block that request until the gate times out, and the test would fail."""
    grammars = local(server).grammars
    real_compile = grammars.compile
    entered, proceed = threading.Event(), threading.Event()

    def gated(spec: Any) -> Any:
        entered.set()
        assert proceed.wait(60), "the held compile was never released"
        return real_compile(spec)

    monkeypatch.setattr(grammars, "compile", gated)
    schema = {"type": "object", "properties": {"gate": {"type": "integer", "minimum": 3, "maximum": 7}},
              "required": ["gate"], "additionalProperties": False}
    answers: dict[str, Any] = {}

    def constrained() -> None:
        answers["constrained"] = client.chat.completions.create(
            model="chat", messages=MESSAGES, max_tokens=30,
            response_format={"type": "json_schema", "json_schema": {"name": "gate", "schema": schema}})

    worker = threading.Thread(target=constrained)
    worker.start()
    try:
        assert entered.wait(60), "the constrained request never reached its compile"
        free = client.with_options(timeout=30).chat.completions.create(model="chat", messages=MESSAGES,
                                                                       max_tokens=8)
        assert free.usage.completion_tokens >= 1 and worker.is_alive()  # answered while the compile waited
    finally:
        proceed.set()
        worker.join(120)
    jsonschema.validate(json.loads(answers["constrained"].choices[0].message.content), schema)


@pytest.mark.parametrize("parser, text", [
    ("hermes", 'Sure.<tool_call>\n{"name":"tap","arguments":{"x":1,"s":"a}\\"{"}}\n</tool_call>\n<tool_call>\n'
               '{"name": "type_text", "arguments": {"text": "hi"}}\n</tool_call>'),
    ("hermes", "no calls here <tool_ca but not"),
    ("hermes", '<tool_call>\n{"arguments": {"x": 1}, "name": "tap"}\n</tool_call>'),
    ("json", '[{"name":"tap","arguments":{"x":1}}, {"name":"tap","arguments":{"x":[2,{"y":3}]}}]'),
    ("json", '{"name":"tap","arguments":{"x":1}}'),
    ("json", '{"arguments":{"x":1},"name":"tap"}'),
    ("json", "plain words"),
])
def test_tool_stream_in_any_pieces_gives_the_parsed_calls(parser: str, text: str) -> None:
    import random

    from edge_runtime.generation import tool_parsers
    from edge_runtime.generation.tool_stream import ToolStream

    content, calls = tool_parsers.parse(parser, text)
    for trial in range(40):
        rng = random.Random(trial)
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 12))))
        stream = ToolStream(parser)
        events = [e for a, b in zip([0, *cuts], [*cuts, len(text)]) for e in stream.feed(text[a:b])]
        events += stream.finish()
        streamed: dict[int, list[str]] = {}
        streamed_content = ""
        for event in events:
            if event[0] == "content":
                streamed_content += event[1]
            elif event[0] == "call":
                streamed[event[1]] = [event[3], ""]
            else:
                streamed[event[1]][1] += event[2]
        assert [streamed[i] for i in sorted(streamed)] == [[c.name, c.arguments] for c in calls]
        assert streamed_content.strip() == (content or "").strip()
