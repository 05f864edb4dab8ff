"""Prompt logprobs: each prompt token's logprob given the tokens before it (vLLM's ``prompt_logprobs``,
and the legacy completions ``echo`` + ``logprobs`` that evaluation harnesses such as lm-eval's
``local-completions`` send to score a continuation).

Oracle: the export's whole prompt in one no-cache forward pass (ONNX Runtime, the graph as
exported), log-softmax at every position. The engine computes them chunk by chunk with its KV cache
(here in 8-token chunks, so chunk boundaries are crossed), in the fused graph and the unfused one.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from generation_fixtures import LiveServer, make_model, openai_client, served_repository, unfused_variant

PROMPT_LENGTH = 37
CHUNKS = {"prefill_chunk_tokens": 8, "idle_prefill_chunk_tokens": 0}


def oracle_logprobs(folder: Path, prompt: list[int]) -> np.ndarray:
    """[len(prompt) - 1, vocab]: row i is the log-distribution of the token after prompt[:i + 1]."""
    import onnxruntime as ort

    from edge_runtime.generation.engine import kv_names
    from edge_runtime.generation.folder import read_folder

    description = read_folder(folder)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(description.model_path), options, providers=["CPUExecutionProvider"])
    n, layout = len(prompt), description.kv
    feeds = {"input_ids": np.array([prompt], np.int64), "attention_mask": np.ones((1, n), np.int64)}
    if description.has_position_ids:
        feeds["position_ids"] = np.arange(n, dtype=np.int64)[None]
    for name in kv_names(layout.layers)[0]:
        feeds[name] = np.zeros((1, layout.kv_heads, 0, layout.head_dim), layout.dtype)
    logits = session.run(["logits"], feeds)[0][0, :-1].astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def _prompt(seed: int, vocab: int = 512) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(10, vocab, PROMPT_LENGTH)]


def _check(scored: Any, prompt: list[int], expected: np.ndarray, top: int) -> None:
    assert [c.token for c in scored] == prompt and scored[0].logprob is None
    for position, choice in enumerate(scored[1:]):
        row = expected[position]
        assert abs(choice.logprob - row[prompt[position + 1]]) < 1e-4, position
        assert choice.rank == 1 + int((row > row[prompt[position + 1]] + 1e-6).sum()), position
        assert [t for t, _ in choice.top] == [int(t) for t in np.argsort(-row, kind="stable")[:top]], position


@pytest.mark.parametrize("graph", ["fused", "unfused"])
def test_prompt_logprobs_equal_a_whole_forward_pass(qwen_folder: Path, tmp_path: Path, graph: str) -> None:
    folder = qwen_folder if graph == "fused" else unfused_variant(qwen_folder, tmp_path / "unfused")
    model = make_model(folder, **CHUNKS)
    try:
        prompt = _prompt(1)
        result = model.generate(prompt, max_tokens=2, prompt_logprobs=3)
        _check(result.prompt_logprobs, prompt, oracle_logprobs(qwen_folder, prompt), 3)
        plain = model.generate(prompt, max_tokens=2)
        assert plain.prompt_logprobs is None and plain.token_ids == result.token_ids  # scoring changes no answer
    finally:
        model.close()


def test_a_cached_prefix_is_scored_anyway(qwen_folder: Path) -> None:
    """The prefix cache holds KV, not logits: a scored prompt is prefilled whole even when cached."""
    model = make_model(qwen_folder, **CHUNKS)
    try:
        prompt = _prompt(2)
        model.generate(prompt, max_tokens=2)  # now in the prefix cache
        cached = model.generate(prompt, max_tokens=2)
        assert cached.usage.cached_tokens > 0
        scored = model.generate(prompt, max_tokens=2, prompt_logprobs=0)
        assert scored.usage.cached_tokens == 0 and scored.token_ids == cached.token_ids
        _check(scored.prompt_logprobs, prompt, oracle_logprobs(qwen_folder, prompt), 0)
    finally:
        model.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, qwen_folder: Path) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("prompt-logprobs-repository")
    shutil.copytree(qwen_folder, root / "chat" / "1")
    (root / "chat" / "config.toml").write_text("[generation]\nprefill_chunk_tokens = 8\n"
                                                "idle_prefill_chunk_tokens = 0\n")
    with served_repository(root, tmp_path_factory.mktemp("cache")) as live:
        yield live


def test_the_legacy_echo_scores_the_prompt_as_lm_eval_asks(server: LiveServer, qwen_folder: Path) -> None:
    """lm-eval's ``local-completions`` loglikelihood request: echo, logprobs 1, max_tokens 1, a token-id prompt."""
    from edge_runtime.server.state import STATE

    client = openai_client(server)
    prompt = _prompt(3)
    answer = client.completions.create(model="chat", prompt=prompt, echo=True, logprobs=1, max_tokens=1,
                                       temperature=0)
    logprobs = answer.choices[0].logprobs
    expected = oracle_logprobs(qwen_folder, prompt)
    text = server.app[STATE].repository.get("chat").model.tokenizer.token_text
    assert logprobs.tokens[:PROMPT_LENGTH] == [text(t) for t in prompt]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert np.allclose(logprobs.token_logprobs[1:PROMPT_LENGTH], expected[np.arange(PROMPT_LENGTH - 1), prompt[1:]],
                       atol=1e-4)
    assert len(logprobs.tokens) == PROMPT_LENGTH + 1  # then the generated token's own
    best = [text(int(t)) for t in expected.argmax(axis=1)]
    assert [next(iter(top)) for top in logprobs.top_logprobs[1:PROMPT_LENGTH]] == best


def test_vllm_prompt_logprobs_field(server: LiveServer, qwen_folder: Path) -> None:
    client = openai_client(server)
    prompt = _prompt(4)
    answer = client.completions.create(model="chat", prompt=prompt, max_tokens=1, temperature=0,
                                       extra_body={"prompt_logprobs": 2})
    entries = answer.choices[0].model_extra["prompt_logprobs"]
    expected = oracle_logprobs(qwen_folder, prompt)
    assert len(entries) == PROMPT_LENGTH and entries[0] is None
    for position, entry in enumerate(entries[1:]):
        own = entry[str(prompt[position + 1])]
        assert abs(own["logprob"] - expected[position, prompt[position + 1]]) < 1e-4
        best = [int(t) for t in np.argsort(-expected[position])[:2]]
        assert [entry[str(t)]["rank"] for t in best] == [1, 2]
    chat = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "tap ok"}],
                                          max_tokens=1, temperature=0, extra_body={"prompt_logprobs": 0})
    scored = chat.choices[0].model_extra["prompt_logprobs"]
    assert scored[0] is None and all(len(entry) == 1 for entry in scored[1:])  # the token alone at 0
    assert len(scored) == chat.usage.prompt_tokens


def test_streamed_prompt_logprobs_are_refused(server: LiveServer) -> None:
    import openai

    client = openai_client(server)
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        client.completions.create(model="chat", prompt="tap", max_tokens=1, stream=True,
                                  extra_body={"prompt_logprobs": 1})
