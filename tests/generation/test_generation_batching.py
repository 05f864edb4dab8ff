"""Continuous batching, chunked prefill, prefix cache, cancellation and admission bounds."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from generation_fixtures import oracle_greedy

PROMPTS = ["tap", "the agent taps the button and reads the screen then scrolls down to find the settings menu",
           "open close swipe left right home back wait type search result page title label value ok cancel",
           "héllo wörld 你好 世界 emoji 🙂", "json name arguments tool call"]


def test_concurrent_requests_give_the_same_tokens_as_alone(batching_folder: Path, qwen_folder: Path,
                                                            model_factory) -> None:
    # the oracle is always the optimum export's no-cache recompute, also for our fused graph
    model = model_factory(batching_folder, max_batch_size=4, prefill_chunk_tokens=8, prefix_cache_bytes=0)
    alone = [model.generate(p, max_tokens=8 + 6 * i) for i, p in enumerate(PROMPTS)]
    steps_alone = model.batcher.stats().steps

    async def collect(i: int, prompt: str) -> tuple[tuple[int, ...], str]:
        chunks = [c async for c in model.stream(prompt, max_tokens=8 + 6 * i)]
        return tuple(t for c in chunks for t in c.token_ids), "".join(c.text for c in chunks)

    async def all_at_once() -> list[tuple[tuple[int, ...], str]]:
        # submitted back to back from one loop: with threads, a fast model finished one request before
        # the next thread submitted, and nothing was shared to check
        return await asyncio.gather(*(collect(i, p) for i, p in enumerate(PROMPTS)))

    together = asyncio.run(all_at_once())  # 5 requests, 4 rows: one waits for a free row
    for i, (a, (ids_together, text_together)) in enumerate(zip(alone, together)):
        assert ids_together == tuple(a.token_ids), f"prompt {i}"
        assert text_together == a.text
        ids = model.prepare(PROMPTS[i]).ids
        assert list(a.token_ids) == oracle_greedy(qwen_folder, ids, 8 + 6 * i, set(model.folder.eos_token_ids))
    assert model.batcher.stats().steps - steps_alone < steps_alone  # decode steps were shared


def test_prefix_cache_hits_give_the_same_tokens_as_misses(batching_folder: Path, model_factory) -> None:
    cold = model_factory(batching_folder, prefix_cache_bytes=0)
    warm = model_factory(batching_folder, prefix_block_tokens=4, prefill_chunk_tokens=16)
    system = {"role": "system", "content": " ".join(PROMPTS[1:4])}
    history = [system, {"role": "user", "content": "step one"}]
    previous = 0
    for step in range(3):
        expected = cold.generate(messages=history, max_tokens=12)
        got = warm.generate(messages=history, max_tokens=12)
        assert got.token_ids == expected.token_ids, f"step {step}"
        if step:  # the agent resent the same system prompt and history: at least that much is not prefilled
            # (random weights answer with broken UTF-8 that re-tokenises differently, so the answer may miss)
            assert got.usage.cached_tokens >= previous // 4 * 4 - 4
        previous = got.usage.prompt_tokens
        history += [{"role": "assistant", "content": got.text}, {"role": "user", "content": f"step {step + 2}"}]
    stats = warm.prefix_cache.stats()
    assert stats.hits >= 2 and stats.hit_tokens > 0 and stats.bytes <= stats.budget_bytes


def test_prefix_cache_lru_stays_under_its_byte_budget(qwen_folder: Path, model_factory) -> None:
    model = model_factory(qwen_folder, prefix_block_tokens=4)
    block_bytes = 4 * model.folder.kv.bytes_per_token
    model.prefix_cache.budget_bytes = 5 * block_bytes
    for prompt in PROMPTS:
        model.generate(prompt, max_tokens=4)
    stats = model.prefix_cache.stats()
    assert stats.bytes <= 5 * block_bytes and stats.evicted_blocks > 0
    again = model.generate(PROMPTS[-1], max_tokens=4)  # the most recent prompt is still cached
    assert again.usage.cached_tokens > 0


def test_cancel_stops_the_sequence_at_the_next_token(batching_folder: Path, model_factory) -> None:
    model = model_factory(batching_folder)
    seen = threading.Event()
    chunks = []

    def sink(chunk) -> None:
        chunks.append(chunk)
        seen.set()

    from edge_runtime.generation.model import sampling_params

    handle = model.submit(model.prepare(PROMPTS[1]), sampling_params(max_tokens=200, ignore_eos=True,
                                                                     temperature=0.0), sink)
    assert seen.wait(30)
    model.cancel(handle)
    deadline = threading.Event()
    for _ in range(300):
        if chunks and chunks[-1].finish_reason:
            break
        deadline.wait(0.05)
    assert chunks[-1].finish_reason == "cancelled"
    assert len([c for c in chunks if c.token_ids]) < 200
    assert model.batcher.pending == 0


def test_generate_past_its_timeout_cancels_and_the_model_answers_the_next_request(batching_folder: Path,
                                                                                  model_factory) -> None:
    model = model_factory(batching_folder)
    with pytest.raises(TimeoutError, match=r"generation took longer than 1e-06 s"):
        model.generate(PROMPTS[1], max_tokens=200, ignore_eos=True, timeout_s=1e-6)
    for _ in range(300):  # the cancelled sequence leaves at its next step
        if model.batcher.pending == 0:
            break
        threading.Event().wait(0.05)
    alone = model.generate(PROMPTS[2], max_tokens=6, ignore_eos=True)
    again = model.generate(PROMPTS[2], max_tokens=6, ignore_eos=True, timeout_s=60)
    assert again.token_ids == alone.token_ids and len(alone.token_ids) == 6


def test_queue_beyond_its_bound_is_refused(qwen_folder: Path, model_factory) -> None:
    from edge_runtime.errors import QueueFullError
    from edge_runtime.generation.model import sampling_params

    model = model_factory(qwen_folder, max_batch_size=1, max_queue=1)
    params = sampling_params(max_tokens=150, ignore_eos=True, temperature=0.0)
    handles = []
    with pytest.raises(QueueFullError, match="queue full"):
        for _ in range(5):
            handles.append(model.submit(model.prepare(PROMPTS[0]), params, lambda c: None))
    for handle in handles:
        model.cancel(handle)


def test_sampling_is_reproducible_with_a_seed_and_honours_stop(qwen_folder: Path, model_factory) -> None:
    model = model_factory(qwen_folder)
    a = model.generate(PROMPTS[0], max_tokens=30, temperature=1.0, top_p=0.9, seed=7)
    b = model.generate(PROMPTS[0], max_tokens=30, temperature=1.0, top_p=0.9, seed=7)
    c = model.generate(PROMPTS[0], max_tokens=30, temperature=1.0, top_p=0.9, seed=8)
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids
    greedy = model.generate(PROMPTS[0], max_tokens=30)
    stop = greedy.text[6:9]
    assert stop
    cut = model.generate(PROMPTS[0], max_tokens=30, stop=[stop])
    assert cut.finish_reason == "stop" and cut.text == greedy.text[:greedy.text.find(stop)]
    penalised = model.generate(PROMPTS[0], max_tokens=30, frequency_penalty=2.0, presence_penalty=2.0)
    assert len(set(penalised.token_ids)) >= len(set(greedy.token_ids))


def _oracle_next_logits(model, prompt: str):
    """The logits of the token after ``prompt``: the export run once by ONNX Runtime, no cache."""
    import numpy as np
    import onnxruntime as ort

    ids = model.prepare(prompt).ids
    session = ort.InferenceSession(str(model.folder.model_path), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": np.array([ids]), "attention_mask": np.ones((1, len(ids)), np.int64),
             "position_ids": np.arange(len(ids))[None]}
    layout = model.folder.kv
    feeds.update({f"past_key_values.{i}.{k}": np.zeros((1, layout.kv_heads, 0, layout.head_dim), np.float32)
                  for i in range(layout.layers) for k in ("key", "value")})
    return session.run(["logits"], feeds)[0][0, -1].astype(np.float64)


def test_logprobs_are_the_log_softmax_of_the_oracle_logits(qwen_folder: Path, model_factory) -> None:
    import numpy as np

    model = model_factory(qwen_folder)
    result = model.generate(PROMPTS[0], max_tokens=3, logprobs=True, top_logprobs=3)
    logits = _oracle_next_logits(model, PROMPTS[0])
    expected = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    first = result.logprobs[0]
    assert first.logprob == pytest.approx(expected[first.token], abs=1e-4)
    assert [t for t, _ in first.top] == list(np.argsort(-expected)[:3])


def test_logit_bias_top_k_and_min_p_act_on_the_oracle_logits(qwen_folder: Path, model_factory) -> None:
    """The first token under each setting, read against the export's own next-token logits."""
    import numpy as np

    from edge_runtime.errors import InvalidInputError

    model = model_factory(qwen_folder)
    logits = _oracle_next_logits(model, PROMPTS[1])
    order = [int(t) for t in np.argsort(-logits, kind="stable")]

    def first(**params) -> int:
        return model.generate(PROMPTS[1], max_tokens=1, **params).token_ids[0]

    assert first() == order[0]
    assert first(logit_bias={order[0]: -100}) == order[1]  # the best banned: greedy takes the second
    assert first(logit_bias={order[-1]: 100}) == order[-1]  # the worst forced
    assert first(logit_bias={order[0]: -100}, logprobs=True) == order[1]  # the float64 path agrees
    assert {first(temperature=1.0, top_k=1, seed=seed) for seed in range(8)} == {order[0]}
    probs = np.exp((logits - logits.max()) / 2.0)  # at temperature 2
    ratio = probs[order[1]] / probs[order[0]]  # the second's probability relative to the best's
    assert {first(temperature=2.0, min_p=(1 + ratio) / 2, seed=seed) for seed in range(8)} == {order[0]}
    drawn = {first(temperature=2.0, top_k=3, seed=seed) for seed in range(40)}
    assert drawn <= set(order[:3]) and len(drawn) > 1
    drawn = {first(temperature=2.0, min_p=ratio * 0.999, top_k=2, seed=seed) for seed in range(40)}
    assert drawn == set(order[:2])
    with pytest.raises(InvalidInputError, match="'logit_bias' token id .* is outside the vocabulary"):
        first(logit_bias={model.folder.vocab_size: 5})
    with pytest.raises(InvalidInputError, match=r"'logit_bias\[3\]' must be a number in \[-100, 100\]"):
        first(logit_bias={3: 101})


def test_stop_token_ids_and_min_tokens_follow_the_greedy_answer(qwen_folder: Path, model_factory) -> None:
    """vLLM's stop_token_ids end the answer at the first one (its text kept: not a special token);
    min_tokens holds back every end (that token, stop strings) until that many tokens are out."""
    from edge_runtime.errors import InvalidInputError

    model = model_factory(qwen_folder)
    greedy = model.generate(PROMPTS[1], max_tokens=24, ignore_eos=True)
    tokens = list(greedy.token_ids)
    stop_at = tokens[3]
    cut = tokens.index(stop_at)
    stopped = model.generate(PROMPTS[1], max_tokens=24, ignore_eos=True, stop_token_ids=[stop_at])
    assert list(stopped.token_ids) == tokens[:cut + 1] and stopped.finish_reason == "stop"
    assert stopped.text == model.generate(PROMPTS[1], max_tokens=cut + 1, ignore_eos=True).text
    # held back for 6 tokens: they equal the answer with that token banned, then it may end the answer
    held = model.generate(PROMPTS[1], max_tokens=24, ignore_eos=True, stop_token_ids=[stop_at], min_tokens=6)
    ends = {stop_at, *model.folder.eos_token_ids}  # min_tokens holds back EOS too
    banned = model.generate(PROMPTS[1], max_tokens=6, ignore_eos=True, logit_bias={t: -100 for t in ends})
    assert len(held.token_ids) >= 6 and list(held.token_ids[:6]) == list(banned.token_ids)
    assert stop_at not in held.token_ids[:6]
    # a stop string at the very start cuts everything; with min_tokens it counts only after them
    start = greedy.text[:2]
    assert model.generate(PROMPTS[1], max_tokens=24, ignore_eos=True, stop=[start]).text == ""
    late = model.generate(PROMPTS[1], max_tokens=24, ignore_eos=True, stop=[start], min_tokens=5)
    assert len(late.token_ids) >= 5 and late.text.startswith(greedy.text[:2])
    with pytest.raises(InvalidInputError, match=r"'min_tokens' \(9\) must not exceed 'max_tokens' \(4\)"):
        model.generate(PROMPTS[1], max_tokens=4, min_tokens=9)
    with pytest.raises(InvalidInputError, match="'stop_token_ids' token id .* is outside the vocabulary"):
        model.generate(PROMPTS[1], max_tokens=4, stop_token_ids=[model.folder.vocab_size])


def test_a_stop_string_straddling_min_tokens_ends_the_answer_at_its_start(qwen_folder: Path, model_factory) -> None:
    """vLLM's rule: stop strings are looked for once min_tokens are out, in the new text and the
    len(stop) - 1 characters before it, so one that starts in the last of the min_tokens tokens and
    ends in the next cuts the answer at its start (vllm/v1/engine/detokenizer.py, check_stop_strings)."""
    from edge_runtime.generation.sampling import StopMatcher

    model = model_factory(qwen_folder)
    greedy = model.generate(PROMPTS[1], max_tokens=24, ignore_eos=True)
    texts = [model.generate(PROMPTS[1], max_tokens=k, ignore_eos=True).text for k in range(1, 25)]
    # the first m whose m-th and (m+1)-th tokens both add text: the stop string is their joint
    m = next(k for k in range(1, 23) if len(texts[k - 1]) > len(texts[k - 2] if k > 1 else "") and
             len(texts[k]) > len(texts[k - 1]))
    boundary = len(texts[m - 1])
    stop = greedy.text[boundary - 1:boundary + 1]
    first = greedy.text.find(stop, boundary - 1)  # vLLM's first match that ends after the boundary
    cut = model.generate(PROMPTS[1], max_tokens=24, ignore_eos=True, stop=[stop], min_tokens=m)
    assert cut.finish_reason == "stop" and cut.text == greedy.text[:first]
    # streamed: the same cut, and nothing of the stop string went out before it was known
    streamed = "".join(c.text for c in model.iter_chunks(PROMPTS[1], max_tokens=24, ignore_eos=True, stop=[stop],
                                                         min_tokens=m))
    assert streamed == cut.text
    # one that ended before min_tokens does not count later, even while its tail is held back
    matcher = StopMatcher(("aba", "ab"))
    assert matcher.feed("xab", match=False) == "x" and matcher.feed("y") == "aby" and not matcher.stopped
    matcher = StopMatcher(("abc",))
    assert matcher.feed("xab", match=False) == "x" and matcher.feed("cd") == "" and matcher.stopped


def test_include_stop_str_in_output_and_skip_special_tokens(qwen_folder: Path, model_factory) -> None:
    """vLLM's ``include_stop_str_in_output`` ends the text after the stop string (streamed alike);
    ``skip_special_tokens: false`` keeps special tokens' text, as the tokenizer decodes them."""
    from edge_runtime.generation.sampling import StopMatcher

    model = model_factory(qwen_folder)
    greedy = model.generate(PROMPTS[1], max_tokens=24, ignore_eos=True)
    stop = greedy.text[5:8]
    first = greedy.text.find(stop)
    kept = model.generate(PROMPTS[1], max_tokens=24, ignore_eos=True, stop=[stop], include_stop_str_in_output=True)
    assert kept.finish_reason == "stop" and kept.text == greedy.text[:first + len(stop)]
    streamed = "".join(c.text for c in model.iter_chunks(PROMPTS[1], max_tokens=24, ignore_eos=True, stop=[stop],
                                                         include_stop_str_in_output=True))
    assert streamed == kept.text
    matcher = StopMatcher(("abc", "zz"), include=True)  # nothing held back; a stop string across two feeds
    assert [matcher.feed(t) for t in ("xa", "b", "cdef")] == ["xa", "b", "c"] and matcher.stopped
    special = model.folder.eos_token_ids[0]
    forced = dict(max_tokens=3, ignore_eos=True, logit_bias={special: 100})
    plain = model.generate(PROMPTS[1], **forced)
    raw = model.generate(PROMPTS[1], skip_special_tokens=False, **forced)
    assert list(plain.token_ids) == list(raw.token_ids) == [special] * 3
    assert plain.text == "" and raw.text == model.tokenizer.tokenizer.decode([special] * 3, skip_special_tokens=False)
    assert raw.text  # the special token has text to keep


def test_a_long_prefill_delays_running_streams_by_one_chunk_at_most(batching_folder: Path, model_factory) -> None:
    from edge_runtime.generation.model import sampling_params

    model = model_factory(batching_folder, prefill_chunk_tokens=8, prefix_cache_bytes=0)
    engine = model.engine
    calls: list[tuple[str, int]] = []
    prefill, decode = engine.prefill, engine.decode
    engine.prefill = lambda tokens, past, inputs=None, **options: (calls.append(("prefill", len(tokens))),
                                                                   prefill(tokens, past, inputs, **options))[1]
    engine.decode = lambda tokens: (calls.append(("decode", len(tokens))), decode(tokens))[1]
    started = threading.Event()
    params = sampling_params(max_tokens=200, ignore_eos=True, temperature=0.0)  # outlives the long prefill
    running = model.submit(model.prepare(PROMPTS[0]), params, lambda c: started.set())
    assert started.wait(30)
    long_prompt = model.prepare(" ".join(PROMPTS[1:4]))
    assert len(long_prompt.ids) > 30
    result = model.generate(long_prompt.ids, max_tokens=4)
    assert result.usage.prompt_tokens == len(long_prompt.ids)
    model.cancel(running)
    first = next(i for i, c in enumerate(calls) if c == ("prefill", 8) and i > 0)
    window = calls[first:first + 2 * (len(long_prompt.ids) // 8)]
    # between two prefill chunks of the long prompt, the running stream got its decode step
    for a, b in zip(window, window[1:]):
        assert not (a[0] == "prefill" and b[0] == "prefill"), window
    assert max(n for kind, n in calls[first:] if kind == "prefill") <= 8


def test_an_idle_batcher_prefills_in_longer_chunks_with_the_same_tokens(batching_folder: Path, qwen_folder: Path,
                                                                       model_factory) -> None:
    """With no stream decoding nobody waits between chunks: ``idle_prefill_chunk_tokens`` applies, and
    the tokens equal the no-cache oracle's (and so those of short chunks)."""
    model = model_factory(batching_folder, prefill_chunk_tokens=8, idle_prefill_chunk_tokens=16,
                          prefix_cache_bytes=0)
    chunks: list[int] = []
    prefill = model.engine.prefill
    model.engine.prefill = lambda tokens, past, inputs=None, **options: (
        chunks.append(len(tokens)), prefill(tokens, past, inputs, **options))[1]
    prompt = model.prepare(" ".join(PROMPTS[1:4]))
    assert len(prompt.ids) > 32  # at least two idle chunks
    result = model.generate(prompt.ids, max_tokens=6)
    n = len(prompt.ids)
    assert chunks == [16] * (n // 16) + ([n % 16] if n % 16 else [])
    assert list(result.token_ids) == oracle_greedy(qwen_folder, prompt.ids, 6, set(model.folder.eos_token_ids))


def test_the_idle_chunk_keeps_its_logits_under_the_cap() -> None:
    """Every chunk position's logits are computed: a large vocabulary shortens the idle chunk (never
    below ``prefill_chunk_tokens``), and running streams always get ``prefill_chunk_tokens``."""
    from edge_runtime.generation.settings import IDLE_CHUNK_LOGITS_BYTES, GenerationSettings

    settings = GenerationSettings(prefill_chunk_tokens=256, idle_prefill_chunk_tokens=1024)
    assert settings.chunk_tokens(False, 4096) == 1024  # 16 MiB of logits
    assert settings.chunk_tokens(True, 4096) == 256
    assert settings.chunk_tokens(False, 32000) == IDLE_CHUNK_LOGITS_BYTES // (4 * 32000) == 524
    assert settings.chunk_tokens(False, 151936) == 256  # Qwen2's vocabulary: 110 would fit, the floor holds
    assert GenerationSettings(prefill_chunk_tokens=256, idle_prefill_chunk_tokens=0).chunk_tokens(False, 4096) == 256
