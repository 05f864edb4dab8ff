"""vLLM's chat rendering fields: ``chat_template_kwargs``, ``add_generation_prompt``, ``continue_final_message``.

Oracle: transformers' ``apply_chat_template`` on the same folder (its ``continue_final_message``
cut and template keyword arguments), then the embedded API against the ``openai`` client.
A template with a Qwen3-style ``enable_thinking`` switch shows the variables reach the template.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edge_runtime.errors import InvalidInputError
from edge_runtime.generation.chat import ChatOptions

# Qwen3's switch in our own words: with enable_thinking false the assistant turn opens with an empty
# think block
THINKING_TEMPLATE = (
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}"
    "{%- if not (loop.last and message['role'] == 'assistant') %}{{ '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")
MESSAGES = [{"role": "system", "content": "You are a phone agent."},
            {"role": "user", "content": "open the settings menu"},
            {"role": "assistant", "content": "do(action=\"Tap\", element=[5"}]


@pytest.fixture(scope="module")
def thinking_folder(qwen_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("thinking") / "qwen"
    shutil.copytree(qwen_folder, folder)
    (folder / "chat_template.jinja").write_text(THINKING_TEMPLATE)
    return folder


@pytest.mark.parametrize("messages", [MESSAGES, [*MESSAGES[:2], {"role": "assistant", "content": "Sure, tapping  "}],
                                      [*MESSAGES[:2], {"role": "assistant", "content": [
                                          {"type": "text", "text": "first "}, {"type": "text", "text": "then"}]}]],
                         ids=["open", "trailing-spaces", "parts"])
def test_rendering_equals_transformers(thinking_folder: Path, model_factory, messages: list) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(thinking_folder)
    model = model_factory(thinking_folder)
    cases = [({"continue_final_message": True, "add_generation_prompt": False}, {"continue_final_message": True}),
             ({"chat_template_kwargs": {"enable_thinking": False}}, {"enable_thinking": False,
                                                                     "add_generation_prompt": True}),
             ({"add_generation_prompt": False}, {})]
    # text parts reach a text model's template joined into one string (``normalize_messages``)
    joined = [{**m, "content": "".join(p["text"] for p in m["content"])} if isinstance(m["content"], list) else m
              for m in messages]
    for ours, theirs in cases:
        expected = hf.apply_chat_template(joined, tokenize=False, **theirs)
        prepared = model.prepare(messages=messages, chat=ChatOptions.from_body(ours))
        assert prepared.text == expected, ours
        assert prepared.ids == hf(expected, add_special_tokens=False)["input_ids"]
    # the switch changed the prompt: the variable reached the template
    assert model.prepare(messages=MESSAGES[:2], chat=ChatOptions(template_kwargs={"enable_thinking": False})).text \
        != model.prepare(messages=MESSAGES[:2]).text


def test_a_continued_message_is_the_answer_s_prefix(thinking_folder: Path, model_factory) -> None:
    """The model goes on from the open assistant message: the answer equals the greedy continuation of
    that prompt given as a plain token-id prompt (no new assistant turn is opened)."""
    model = model_factory(thinking_folder)
    options = {"continue_final_message": True, "add_generation_prompt": False}
    result = model.generate(messages=MESSAGES, max_tokens=8, ignore_eos=True, **options)
    ids = model.prepare(messages=MESSAGES, chat=ChatOptions.from_body(options)).ids
    assert list(result.token_ids) == list(model.generate(ids, max_tokens=8, ignore_eos=True).token_ids)
    assert not model.tokenizer.decode(ids).endswith("<|im_end|>\n")


def test_bad_options_are_named(thinking_folder: Path, model_factory) -> None:
    model = model_factory(thinking_folder)
    with pytest.raises(InvalidInputError, match="Cannot set both 'continue_final_message' and 'add_generation_prompt'"):
        model.generate(messages=MESSAGES, max_tokens=2, continue_final_message=True)
    with pytest.raises(InvalidInputError, match=r"'chat_template_kwargs' may not set \['messages', 'tools'\]"):
        ChatOptions.from_body({"chat_template_kwargs": {"messages": [], "tools": [], "x": 1}})
    with pytest.raises(InvalidInputError, match="'chat_template_kwargs' must be an object"):
        ChatOptions.from_body({"chat_template_kwargs": ["enable_thinking"]})
    with pytest.raises(InvalidInputError, match="'add_generation_prompt' must be true or false"):
        ChatOptions.from_body({"add_generation_prompt": "yes"})
    with pytest.raises(InvalidInputError, match="final message has no text to continue"):
        model.prepare(messages=[*MESSAGES[:2], {"role": "assistant", "content": " "}],
                      chat=ChatOptions(add_generation_prompt=False, continue_final_message=True))
