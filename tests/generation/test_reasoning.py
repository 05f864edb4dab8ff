"""A thinking model's reasoning apart from its answer (``[generation] reasoning_parser``), as vLLM's
reasoning parsers give it: ``reasoning_content`` / ``reasoning`` beside ``content``.

A random-weight decoder does not think, so its answers are shaped by a regex constraint
(``structured_outputs``) into ``<think>...</think>`` form. The oracle of each split is the raw answer
of the same weights served without the parser (greedy, same constraint: the same tokens), cut at
its tags by the test's own pattern; streamed deltas must assemble to the whole answer's fields.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from generation_fixtures import LiveServer, openai_client, served_repository

MESSAGES = [{"role": "system", "content": "You are a phone agent."},
            {"role": "user", "content": "open the settings menu"}]
THINK_THEN_ANSWER = r"<think>[a-z ]{4,14}</think>\n\n[a-z ]{3,12}"
# A template that opens the reasoning block itself (as R1 distills and Qwen3-Thinking-2507 do)
OPENING_TEMPLATE = (
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}")
TAP = {"type": "function", "function": {"name": "tap", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
    "required": ["x", "y"]}}}
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>"
    "<tool_call><|im_end|>\n{%- endif %}{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' "
    "+ message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{%- endif %}")


# --- the parser alone ------------------------------------------------------------------------------

SPLITS = [  # (answer, prompt opened the block, reasoning, content)
    ("<think>\nthe menu</think>\n\nopen it", False, "\nthe menu", "\n\nopen it"),
    ("  <think>only thinking", False, "only thinking", None),  # cut short by max_tokens
    ("a plain answer", False, None, "a plain answer"),
    ("<thin", False, None, "<thin"),
    ("x <think>y</think>", False, None, "x <think>y</think>"),  # a tag inside the answer is text
    ("first</think>\n\nthen", True, "first", "\n\nthen"),
    ("<think>first</think>then", True, "first", "then"),  # a model that writes the opened tag again
    ("no end yet", True, "no end yet", None),
    ("</think>", True, "", None),
    ("a</think>b</think>c", True, "a", "b</think>c"),
]


@pytest.mark.parametrize("answer,opened,thought,content", SPLITS)
def test_split_and_every_streamed_cut_agree(answer: str, opened: bool, thought: str | None,
                                            content: str | None) -> None:
    from edge_runtime.generation.reasoning import ReasoningStream, split

    assert split(answer, opened) == (thought, content)
    for first in range(len(answer) + 1):  # the answer streamed in three pieces, cut everywhere
        for second in range(first, len(answer) + 1):
            stream = ReasoningStream(opened)
            events = (stream.feed(answer[:first]) + stream.feed(answer[first:second]) + stream.feed(answer[second:])
                      + stream.finish())
            assert all(piece for _, piece in events)
            assert "".join(p for k, p in events if k == "reasoning") == (thought or "")
            assert "".join(p for k, p in events if k == "content") == (content or "")


def test_reasoning_pieces_leave_before_the_answer_ends() -> None:
    from edge_runtime.generation.reasoning import ReasoningStream

    stream = ReasoningStream(False)
    assert stream.feed("<think>look") == [("reasoning", "look")]
    assert stream.feed(" at it</th") == [("reasoning", " at it")]  # '</th' held: it may close the block
    assert stream.feed("ink>tap") == [("content", "tap")]


@pytest.mark.parametrize("prompt,opened", [
    ("<|im_start|>assistant\n<think>\n", True),
    ("<|im_start|>assistant\n", False),
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),  # Qwen3 with enable_thinking false
    ("<think>old</think> then <think>", True),
])
def test_the_prompt_says_whether_the_block_is_open(prompt: str, opened: bool) -> None:
    from edge_runtime.generation.reasoning import opens_in_prompt

    assert opens_in_prompt(prompt) is opened


def test_unknown_parser_is_a_config_error() -> None:
    from edge_runtime.errors import ConfigError
    from edge_runtime.generation.settings import GenerationSettings

    assert GenerationSettings(reasoning_parser="deepseek_r1").reasoning_parser == "deepseek_r1"
    with pytest.raises(ConfigError, match="reasoning_parser must be one of"):
        GenerationSettings(reasoning_parser="r1")


def test_a_cloud_peers_reasoning_deltas_are_read_under_either_name() -> None:
    from edge_runtime.generation.openai_cloud import parse_event

    old = parse_event({"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}, "finish_reason": None}]})
    new = parse_event({"choices": [{"index": 0, "delta": {"reasoning": "hm", "content": None}}]})
    assert (old.reasoning, old.text) == ("hm", "") and (new.reasoning, new.text) == ("hm", "")


# --- served -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, qwen_folder: Path) -> Path:
    root = tmp_path_factory.mktemp("reasoning-repository")
    models = (("plain", "", None), ("thinker", "qwen3", None), ("opening-plain", "", OPENING_TEMPLATE),
              ("opening", "deepseek_r1", OPENING_TEMPLATE), ("hermes-plain", "", HERMES_TEMPLATE),
              ("hermes", "think", HERMES_TEMPLATE))
    for name, parser, template in models:
        shutil.copytree(qwen_folder, root / name / "1")
        if parser:
            # the regex that shapes the answer constrains its reasoning too (vLLM's enable_in_reasoning)
            (root / name / "config.toml").write_text(f'[generation]\nreasoning_parser = "{parser}"\n'
                                                     'structured_in_reasoning = true\n')
        if template is not None:
            (root / name / "1" / "chat_template.jinja").write_text(template)
    return root


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with served_repository(repository, tmp_path_factory.mktemp("cache")) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Any:
    return openai_client(server)


def _ask(client: Any, model: str, pattern: str, **extra: Any) -> Any:
    return client.chat.completions.create(model=model, messages=MESSAGES, temperature=0, max_tokens=60,
                                          extra_body={"structured_outputs": {"regex": pattern}, **extra})


def _streamed(client: Any, model: str, pattern: str, **extra: Any) -> tuple[str, str, str, str | None]:
    """(reasoning_content, reasoning, content) of a stream's deltas, and its finish reason."""
    stream = client.chat.completions.create(model=model, messages=MESSAGES, temperature=0, max_tokens=60,
                                            stream=True, extra_body={"structured_outputs": {"regex": pattern},
                                                                     **extra})
    old, new, content, finish = [], [], [], None
    for event in stream:
        for choice in event.choices:
            extra_fields = choice.delta.model_extra or {}
            old.append(extra_fields.get("reasoning_content") or "")
            new.append(extra_fields.get("reasoning") or "")
            content.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(old), "".join(new), "".join(content), finish


def test_reasoning_apart_from_content_whole_and_streamed(client: Any, qwen_folder: Path) -> None:
    from tokenizers import Tokenizer

    plain = _ask(client, "plain", THINK_THEN_ANSWER)
    raw = plain.choices[0].message
    assert (raw.model_extra or {}).get("reasoning_content") is None  # parser off: the answer as written
    assert plain.usage.completion_tokens_details is None
    thought, answer = re.fullmatch(r"<think>(.*?)</think>(.*)", raw.content, re.S).groups()

    whole = _ask(client, "thinker", THINK_THEN_ANSWER)
    message = whole.choices[0].message
    assert message.model_extra["reasoning_content"] == message.model_extra["reasoning"] == thought
    assert message.content == answer
    thinking = len(Tokenizer.from_file(str(qwen_folder / "tokenizer.json")).encode(thought,
                                                                                 add_special_tokens=False).ids)
    assert whole.usage.completion_tokens_details.reasoning_tokens == thinking > 0
    events = list(client.chat.completions.create(
        model="thinker", messages=MESSAGES, temperature=0, max_tokens=60, stream=True,
        stream_options={"include_usage": True}, extra_body={"structured_outputs": {"regex": THINK_THEN_ANSWER}}))
    assert events[-1].usage.completion_tokens_details.reasoning_tokens == thinking
    assert _streamed(client, "thinker", THINK_THEN_ANSWER) == (thought, thought, answer, "stop")

    hidden = _ask(client, "thinker", THINK_THEN_ANSWER, include_reasoning=False).choices[0].message
    assert "reasoning_content" not in (hidden.model_extra or {}) and hidden.content == answer
    assert _streamed(client, "thinker", THINK_THEN_ANSWER, include_reasoning=False) == ("", "", answer, "stop")


def test_a_block_the_template_opened(client: Any, server: LiveServer) -> None:
    pattern = r"[a-z ]{4,14}</think>\n\n[a-z ]{3,12}"
    raw = _ask(client, "opening-plain", pattern).choices[0].message.content
    thought, answer = raw.split("</think>", 1)
    message = _ask(client, "opening", pattern).choices[0].message
    assert (message.model_extra["reasoning_content"], message.content) == (thought, answer)
    assert _streamed(client, "opening", pattern) == (thought, thought, answer, "stop")

    cut = _ask(client, "opening", r"[a-z ]{30,40}</think>x", max_tokens=4).choices[0]  # cut short: all reasoning
    assert cut.finish_reason == "length" and cut.message.content is None and cut.message.model_extra["reasoning"]

    from edge_runtime.server.state import STATE

    model = server.app[STATE].repository.get("opening").model  # the embedded API splits the same way
    result = model.generate(messages=MESSAGES, max_tokens=60, structured_outputs={"regex": pattern})
    assert (result.reasoning, result.content, result.text) == (thought, answer, raw)


def test_tool_calls_are_read_after_the_reasoning(client: Any) -> None:
    pattern = (r'<think>[a-z ]{4,10}</think>\n\n<tool_call>\n\{"name": "tap", "arguments": '
               r'\{"x": [1-9], "y": [1-9]\}\}\n</tool_call>')
    messages = MESSAGES[1:]  # the tool list takes most of the test model's 256 positions
    raw = client.chat.completions.create(model="hermes-plain", messages=messages, temperature=0, max_tokens=80,
                                         tools=[TAP], extra_body={"structured_outputs": {"regex": pattern}})
    plain = raw.choices[0].message  # without the parser the call is read and the reasoning stays content
    assert plain.content.startswith("<think>") and len(plain.tool_calls) == 1
    thought = re.fullmatch(r"<think>(.*?)</think>", plain.content, re.S).group(1)
    arguments = plain.tool_calls[0].function.arguments

    answer = client.chat.completions.create(model="hermes", messages=messages, temperature=0, max_tokens=80,
                                            tools=[TAP], extra_body={"structured_outputs": {"regex": pattern}})
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.model_extra["reasoning_content"] == thought
    assert choice.message.content is None
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [("tap", arguments)]

    stream = client.chat.completions.create(model="hermes", messages=messages, temperature=0, max_tokens=80,
                                            tools=[TAP], stream=True,
                                            extra_body={"structured_outputs": {"regex": pattern}})
    reasoning_text, names, pieces, finish = [], [], [], None
    for event in stream:
        for c in event.choices:
            reasoning_text.append((c.delta.model_extra or {}).get("reasoning_content") or "")
            for call in c.delta.tool_calls or []:
                names.append(call.function.name) if call.function.name else None
                pieces.append(call.function.arguments or "")
            finish = c.finish_reason or finish
    assert ("".join(reasoning_text), names, "".join(pieces), finish) == (thought, ["tap"], arguments, "tool_calls")



# --- a grammar after the reasoning (vLLM's structured output with a reasoning parser) -----------------

ACTION = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}


@pytest.mark.parametrize("start,text,accepted", [
    ("optional", '<think>look at it</think>\n\n{"x":1}', True),
    ("optional", '{"x":1}', True),  # a model that does not think answers at once
    ("optional", 'look</think>{"x":1}', False),  # no block was opened
    ("optional", '<think>a</think>b</think>{"x":1}', False),  # text between the block and the answer
    ("optional", "<think>still thinking", None),  # not finished: neither refused nor complete
    ("open", 'look at it</think>\n{"x":2}', True),
    ("open", '{"x":1}', None),  # inside the open block: the JSON is reasoning, the answer still to come
    ("", '<think>a</think>{"x":1}', False),  # no reasoning parser: the grammar from the first token
])
def test_a_grammar_holds_after_the_reasoning(qwen_folder: Path, start: str, text: str, accepted: bool | None) -> None:
    """llguidance itself (the engine's matcher) reads the wrapped grammar against the model's tokens."""
    from edge_runtime.generation.constraints import GrammarCache, GrammarSpec

    tokenizer_json = (qwen_folder / "tokenizer.json").read_text()
    cache = GrammarCache(lambda: tokenizer_json, 10**6, [])
    cache.vocab_size = cache.tokenizer.vocab_size
    guide = cache.guide(GrammarSpec("json_schema", json.dumps(ACTION), "response_format", after_reasoning=start))
    consumed = guide.matcher.consume_tokens(cache.tokenizer.tokenize_str(text))
    outcome = (guide.matcher.is_accepting() or None) if consumed and not guide.matcher.is_error() else False
    assert outcome is accepted


def test_the_served_default_constrains_only_the_answer(tmp_path_factory: pytest.TempPathFactory,
                                                       qwen_folder: Path) -> None:
    """With the parser on (defaults otherwise), a chat request's grammar is compiled behind the reasoning:
    "open" under a template that opens <think>, "optional" otherwise; a completion's is not."""
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings

    folder = tmp_path_factory.mktemp("opening") / "model"
    shutil.copytree(qwen_folder, folder)
    (folder / "chat_template.jinja").write_text(OPENING_TEMPLATE)
    plain = GenerativeModel("plain", qwen_folder, GenerationSettings(reasoning_parser="qwen3"), threads=1)
    opening = GenerativeModel("opening", folder, GenerationSettings(reasoning_parser="qwen3"), threads=1)
    schema = {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ACTION}}}
    try:
        assert plain.structure(schema, plain_params())[1].guide.after_reasoning == "optional"
        assert plain.structure(schema, plain_params(), chat=False)[1].guide.after_reasoning == ""
        assert opening.structure(schema, plain_params())[1].guide.after_reasoning == "open"
        result = opening.generate(messages=MESSAGES, max_tokens=12, **schema)  # rambles inside the open block
        assert result.finish_reason == "length" and result.content is None and result.reasoning == result.text
        assert not result.text.startswith('{"x"')  # the schema did not hold from the first token
    finally:
        plain.close()
        opening.close()


def plain_params() -> Any:
    from edge_runtime.generation.sampling import SamplingParams

    return SamplingParams(max_tokens=8)
