"""Greedy generation against independent oracles: a no-cache recompute and transformers' generate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from generation_fixtures import oracle_greedy

MESSAGES = [{"role": "system", "content": "You are a phone agent."},
            {"role": "user", "content": "open the settings menu then scroll down, héllo 你好"}]


def test_greedy_equals_no_cache_oracle(onnx_folder: Path, model_factory) -> None:
    # several prefill chunks per prompt, also with no stream decoding
    model = model_factory(onnx_folder, prefill_chunk_tokens=7, idle_prefill_chunk_tokens=0)
    for messages in (MESSAGES, MESSAGES[1:]):
        prepared = model.prepare(messages=messages)
        result = model.generate(messages=messages, max_tokens=24)
        expected = oracle_greedy(onnx_folder, prepared.ids, 24, set(model.folder.eos_token_ids))
        assert list(result.token_ids) == expected
        assert result.usage.prompt_tokens == len(prepared.ids)
        assert result.usage.completion_tokens == len(expected)
        assert result.finish_reason == ("stop" if expected[-1] in model.folder.eos_token_ids else "length")


def test_greedy_equals_transformers_generate(onnx_folder: Path, hf_model_folder: Path, model_factory) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_model_folder).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(hf_model_folder)
    model = model_factory(onnx_folder)
    answers = {}
    # repetition_penalty: transformers' own logits processor is the oracle of vLLM's parameter
    for messages, penalty in ((MESSAGES, 1.0), ([{"role": "user", "content": "tap ok"}], 1.0), (MESSAGES, 1.5), (MESSAGES, 0.5)):
        ids = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
        assert model.prepare(messages=messages).ids == ids  # our template rendering = transformers'
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=20, do_sample=False, repetition_penalty=penalty,
                              pad_token_id=hf_tokenizer.pad_token_id or hf.generation_config.eos_token_id[0])
        expected = out[0, len(ids):].tolist()
        result = model.generate(messages=messages, max_tokens=20, repetition_penalty=penalty)
        assert list(result.token_ids) == expected
        assert result.text == hf_tokenizer.decode(expected, skip_special_tokens=True)
        answers[len(answers)] = expected
    assert answers[3] != answers[0]  # the penalty changed the answer: the check above could tell
    prompt = "the agent taps the button"
    assert model.prepare(prompt).ids == hf_tokenizer(prompt)["input_ids"]


def test_streaming_concatenates_to_the_whole_text(onnx_folder: Path, model_factory) -> None:
    import asyncio

    model = model_factory(onnx_folder)

    async def collect() -> list:
        return [chunk async for chunk in model.stream(messages=MESSAGES, max_tokens=40)]

    chunks = asyncio.run(collect())
    whole = model.generate(messages=MESSAGES, max_tokens=40)
    assert "".join(c.text for c in chunks) == whole.text
    assert [t for c in chunks for t in c.token_ids] == list(whole.token_ids)
    assert all("\ufffd" not in c.text for c in chunks) or "\ufffd" in whole.text
    assert chunks[-1].finish_reason == whole.finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == len(whole.token_ids)
    assert whole.usage.cached_tokens > 0  # the second request found the first one's prompt cached
    assert whole.text == model.tokenizer.decode(whole.token_ids)


def test_prompt_longer_than_context_names_both_lengths(qwen_folder: Path, model_factory) -> None:
    from edge_runtime.errors import InvalidInputError

    model = model_factory(qwen_folder, max_seq_len=64)
    own = json.loads((qwen_folder / "config.json").read_text())["max_position_embeddings"]
    assert own > 64  # so the message must name the setting that cut the context
    fix = rf"\(\[generation\] max_seq_len = 64 caps the model's {own}: raise it"
    with pytest.raises(InvalidInputError, match=rf"is 7\d tokens; this model's context is 64 .*{fix}"):
        model.generate(list(range(3, 3 + 70)), max_tokens=4)
    with pytest.raises(InvalidInputError, match=rf"max_tokens \(100\) exceeds this model's context of 64 tokens: "
                                                 rf"ask for at most 54 new tokens {fix}"):
        model.generate(list(range(3, 13)), max_tokens=100)
    assert len(model.generate(list(range(3, 13)), max_tokens=54, ignore_eos=True).token_ids) == 54  # the room named
    uncapped = model_factory(qwen_folder)  # the default max_seq_len is above the model's own context
    with pytest.raises(InvalidInputError, match=rf"context of {own} tokens: ask for at most {own - 10} new tokens$"):
        uncapped.generate(list(range(3, 13)), max_tokens=own)


def test_folder_description(qwen_folder: Path) -> None:
    from edge_runtime.generation.folder import is_generative_folder, read_folder

    description = read_folder(qwen_folder)
    config = json.loads((qwen_folder / "config.json").read_text())
    assert description.kv.layers == config["num_hidden_layers"]
    assert description.kv.kv_heads == config["num_key_value_heads"] < config["num_attention_heads"]  # GQA
    assert len(description.eos_token_ids) == 2  # generation_config.json lists two EOS ids
    assert is_generative_folder(qwen_folder) and not is_generative_folder(qwen_folder.parent)


def test_greedy_picks_the_lowest_of_tied_ids_on_the_fast_path_and_the_full_one() -> None:
    import numpy as np

    from edge_runtime.generation.sampling import Sampler, SamplingParams

    logits = np.random.default_rng(3).standard_normal(16384).astype(np.float32)
    logits[[9000, 41, 12000]] = logits.max() + 1.0  # a three-way tie for the best logit
    fast = Sampler(SamplingParams(temperature=0.0)).choose(logits)  # argmax on the float32 logits
    full = Sampler(SamplingParams(temperature=0.0, logprobs=True)).choose(logits)  # the float64 path
    assert fast.token == full.token == 41 and fast.logprob is None and full.logprob is not None
