"""The VLM engine on tiny random-weight folders (``vlm_zoo.write_vlm_folder``): greedy tokens against a
no-cache recompute oracle, streaming, continuous batching of image and text requests, prefix-cache
keys with image digests, and its errors.

The oracle runs the folder's three graphs in plain ONNX Runtime sessions: each step embeds the whole
sequence (prompt + generated) with ``embed_tokens``, overwrites the image-token rows with the
``vision_encoder`` features, takes M-RoPE positions from transformers' own ``get_rope_index``, and runs
the decoder with an empty past. Preprocessing and the prompt text come from the model's ``prepare``
(transformers-parity of those is tested with the preprocessing and converter code).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.errors import InvalidInputError
from vlm_oracle import Oracle

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "idefics3", "smolvlm", "glm4v", "qwen3_vl"]
SYSTEM = ("You are a phone agent. You see the current screenshot and answer with the next action: tap, "
          "swipe, type or done. Think about what is on the screen first. ")


def _image(seed: int, width: int = 112, height: int = 84):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _messages(image, text: str = "What should I tap?", history: tuple[str, ...] = ()) -> list[dict]:
    turns = [{"role": "system", "content": SYSTEM}]
    for i, said in enumerate(history):
        turns.append({"role": "user" if i % 2 == 0 else "assistant", "content": said})
    content = [{"type": "text", "text": text}]
    if image is not None:
        content.insert(0, {"type": "image", "image": image})
    return [*turns, {"role": "user", "content": content}]


@pytest.fixture(scope="module", params=FAMILIES)
def vlm_folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge_runtime.vlm_zoo import write_vlm_folder

    return write_vlm_folder(tmp_path_factory.mktemp(request.param), request.param, seed=1)


@pytest.fixture
def vlm_factory(vlm_folder: Path):
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings

    made = []

    def build(**settings):
        settings.setdefault("max_seq_len", 1024)
        model = GenerativeModel(vlm_folder.name, vlm_folder, GenerationSettings(**settings), threads=1)
        made.append(model)
        return model

    yield build
    for model in made:
        model.close()


def _processed(model, images: list) -> list:
    return [model.prompter.processor.process(image) for image in images]


def test_greedy_tokens_equal_the_no_cache_oracle(vlm_factory) -> None:
    # chunks cut through the image tokens (idle too: no longer chunks while nothing decodes)
    model = vlm_factory(prefill_chunk_tokens=8, idle_prefill_chunk_tokens=0, prefix_cache_bytes=0)
    oracle = Oracle(model)
    one, two = _image(1), _image(2, 56, 140)
    cases = [({"messages": _messages(one)}, [one]),
             ({"prompt": "Compare the two screens.", "images": [one, two]}, [one, two]),
             ({"messages": _messages(None, "No screenshot this time.")}, [])]
    for kwargs, images in cases:
        result = model.generate(**kwargs, max_tokens=10, ignore_eos=True)
        prepared = model.prepare(kwargs.get("prompt"), kwargs.get("messages"), kwargs.get("images"))
        assert list(result.token_ids) == oracle.greedy(prepared.ids, _processed(model, images), 10), kwargs
        image_tokens = sum(p.num_tokens for p in _processed(model, images))
        assert result.usage.prompt_tokens == len(prepared.ids)
        assert prepared.ids.count(model.vlm.image_token_id) == image_tokens  # image tokens count in usage


def test_streamed_text_equals_non_streamed(vlm_factory) -> None:
    model = vlm_factory()
    messages = _messages(_image(3))

    async def streamed() -> tuple[str, list[int]]:
        texts, ids = [], []
        async for chunk in model.stream(messages=messages, max_tokens=12, ignore_eos=True):
            texts.append(chunk.text)
            ids.extend(chunk.token_ids)
        return "".join(texts), ids

    text, ids = asyncio.run(streamed())
    result = model.generate(messages=messages, max_tokens=12, ignore_eos=True)
    assert (text, ids) == (result.text, list(result.token_ids))
    chunks = list(model.iter_chunks(messages=messages, max_tokens=12, ignore_eos=True))
    assert "".join(c.text for c in chunks) == result.text


def test_concurrent_image_and_text_requests_equal_each_alone(vlm_factory) -> None:
    requests = [{"messages": _messages(_image(4))}, {"prompt": "Once upon a time"},
                {"prompt": "Two screens:", "images": [_image(5, 84, 56), _image(6)]},
                {"messages": _messages(None, "hello there")}, {"messages": _messages(_image(7), "and now?")}]
    alone_model = vlm_factory(max_batch_size=1, prefix_cache_bytes=0)
    alone = [list(alone_model.generate(**r, max_tokens=6 + 3 * i, ignore_eos=True).token_ids)
             for i, r in enumerate(requests)]
    model = vlm_factory(max_batch_size=4, prefill_chunk_tokens=16)
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda ir: list(model.generate(**ir[1], max_tokens=6 + 3 * ir[0],
                                                                ignore_eos=True).token_ids), enumerate(requests)))
    assert together == alone
    assert model.batcher.stats().steps < sum(len(t) for t in alone)  # rows really shared decode steps


def test_prefix_cache_hit_with_the_same_image_equals_a_miss(vlm_factory) -> None:
    messages = _messages(_image(8))
    miss = vlm_factory(prefix_cache_bytes=0).generate(messages=messages, max_tokens=10, ignore_eos=True)
    model = vlm_factory(prefix_block_tokens=4)
    first = model.generate(messages=messages, max_tokens=10, ignore_eos=True)
    second = model.generate(messages=messages, max_tokens=10, ignore_eos=True)
    ids = model.prepare(messages=messages).ids
    last_image_token = max(i for i, t in enumerate(ids) if t == model.vlm.image_token_id)
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens > last_image_token  # the image's KV was reused
    assert first.token_ids == second.token_ids == miss.token_ids


def test_a_different_image_never_reuses_kv_past_the_text_prefix(vlm_factory) -> None:
    model = vlm_factory(prefix_block_tokens=4)
    history = ("Open the settings.", "tap(120, 300)", "Now scroll down.", "swipe(up)")
    first = _messages(_image(9), history=history)
    other = _messages(_image(10), history=history)
    model.generate(messages=first, max_tokens=4, ignore_eos=True)
    result = model.generate(messages=other, max_tokens=8, ignore_eos=True)
    ids = model.prepare(messages=other).ids
    first_image_token = ids.index(model.vlm.image_token_id)
    assert 0 < result.usage.cached_tokens <= first_image_token  # the text prefix hit, nothing after it
    fresh = vlm_factory(prefix_cache_bytes=0).generate(messages=other, max_tokens=8, ignore_eos=True)
    assert result.token_ids == fresh.token_ids
    # The agent's next step: the old screenshot stripped, text turns added, a new screenshot.
    stripped = _messages(_image(11), history=(*history, "What now?", result.text))
    step = model.generate(messages=stripped, max_tokens=4, ignore_eos=True)
    assert step.usage.cached_tokens >= first_image_token - model.settings.prefix_block_tokens


def test_vision_work_runs_on_the_callers_thread(vlm_factory) -> None:
    model = vlm_factory()
    threads = []
    encode = model.prompter.encoder.encode
    model.prompter.encoder.encode = lambda *a: (threads.append(threading.current_thread()), encode(*a))[1]
    result = model.generate(messages=_messages(_image(12)), max_tokens=3)
    assert threads == [threading.current_thread()]
    assert result.timings is not None and result.timings.vision_encode_ms > 0
    assert result.timings.first_token_ms >= result.timings.prepare_ms


def test_image_errors_name_both_counts(vlm_factory) -> None:
    model = vlm_factory()
    placeholder = model.prompter.processor.placeholder
    with pytest.raises(InvalidInputError, match=r"2 image placeholder.*1 image"):
        model.generate(prompt=f"a {placeholder} b {placeholder}", images=[_image(1)], max_tokens=2)
    with pytest.raises(InvalidInputError, match=r"At most 8 image\(s\) may be provided in one prompt"):
        model.generate(prompt="x", images=[_image(1)] * 9, max_tokens=2)
    with pytest.raises(InvalidInputError, match=r"messages\[1\]\.content\[0\]\.image_url"):
        model.generate(messages=[{"role": "system", "content": "s"}, {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}]}], max_tokens=2)
    with pytest.raises(InvalidInputError, match="messages\\[0\\].content\\[0\\]"):
        model.generate(messages=[{"role": "user", "content": [{"type": "audio", "audio": "x"}]}], max_tokens=2)


def test_a_text_model_refuses_images(qwen_folder: Path, model_factory) -> None:
    model = model_factory(qwen_folder)
    with pytest.raises(InvalidInputError, match="is not a multimodal model"):
        model.generate(prompt="hi", images=[_image(1)], max_tokens=2)


def test_runtime_loads_the_vision_encoder_like_any_tensor_model(vlm_folder: Path, vlm_factory,
                                                                tmp_path: Path) -> None:
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.generation.vision.settings import VisionSettings
    from edge_runtime.model import Model
    from edge_runtime.runtime import Runtime

    runtime = Runtime(RuntimeConfig(cache_dir=tmp_path, probe_opencl=False, intra_op_threads=1))
    model = runtime.load_generative(vlm_folder, vision=VisionSettings(plan="cpu", precision="fp32"))
    try:
        assert isinstance(model.prompter.encoder.model, Model)
        assert model.prompter.encoder.model.report.backend == "cpu"
        request = {"prompt": "Describe the screen.", "images": [_image(13)], "max_tokens": 8, "ignore_eos": True}
        direct = vlm_factory().generate(**request)
        assert model.generate(**request).token_ids == direct.token_ids
    finally:
        model.close()
        runtime.close()


def test_generate_command_with_images_equals_the_embedded_api(vlm_folder: Path, vlm_factory, tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    image = tmp_path / "screen.png"
    _image(14).save(image)
    messages = _messages(None, "What is on the screen?")
    (tmp_path / "messages.json").write_text(json.dumps(messages))
    model = vlm_factory()
    from_messages = model.generate(messages=[*messages[:-1], {"role": "user", "content": [
        {"type": "image", "image": image}, {"type": "text", "text": "What is on the screen?"}]}], max_tokens=6)
    from_prompt = model.generate(prompt="Describe:", images=[image], max_tokens=6)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "EDGE_RUNTIME_CACHE": str(tmp_path), "PYTHONPATH": str(root), "EDGE_RUNTIME_THREADS": "1"}
    for args, expected in ((["--messages", str(tmp_path / "messages.json")], from_messages),
                           (["--prompt", "Describe:"], from_prompt)):
        run = subprocess.run([sys.executable, "-m", "edge_runtime", "generate", str(vlm_folder), "--image", str(image),
                              *args, "--max-tokens", "6", "--json"], capture_output=True, text=True, env=env,
                             timeout=240)
        assert run.returncode == 0, run.stderr
        report = json.loads(run.stdout)
        assert report["token_ids"] == list(expected.token_ids)
        assert report["usage"]["prompt_tokens"] == expected.usage.prompt_tokens
        assert report["timings_ms"]["vision_encode_ms"] > 0


def test_warm_up_runs_the_decoder_and_the_vision_encoder(vlm_factory) -> None:
    from edge_runtime.generation.warmup import GenerationWarmupConfig, warm_up_generative

    model = vlm_factory()
    calls = []
    encode = model.prompter.encoder.encode
    model.prompter.encoder.encode = lambda feeds, tokens: (calls.append(tokens), encode(feeds, tokens))[1]
    report = warm_up_generative(model, GenerationWarmupConfig(prompt_tokens=12, decode_steps=2))
    assert report.done and report.vision_ms > 0 and len(calls) == 1
    assert model.batcher.warmups == 1
    request = {"messages": _messages(_image(15)), "max_tokens": 6, "ignore_eos": True}
    assert model.generate(**request).token_ids == vlm_factory().generate(**request).token_ids


def test_an_image_request_delays_running_streams_by_one_prefill_chunk_at_most(vlm_factory) -> None:
    """The batcher thread only ever runs decode steps and single prefill chunks: while an image
    request is encoded (on the caller's thread) and prefilled, a running stream gets a decode step
    between any two of its chunks, and the engine never sees the vision encoder."""
    from edge_runtime.generation.model import sampling_params

    model = vlm_factory(prefill_chunk_tokens=8, prefix_cache_bytes=0)
    engine = model.engine
    calls: list[tuple[str, str, int]] = []
    prefill, decode, encode = engine.prefill, engine.decode, model.prompter.encoder.encode

    def record(kind: str, n: int) -> None:
        calls.append((kind, threading.current_thread().name, n))

    engine.prefill = lambda tokens, past, inputs=None, **options: (record("prefill", len(tokens)),
                                                                   prefill(tokens, past, inputs, **options))[1]
    engine.decode = lambda tokens: (record("decode", len(tokens)), decode(tokens))[1]
    model.prompter.encoder.encode = lambda feeds, n: (record("encode", n), encode(feeds, n))[1]
    started = threading.Event()
    params = sampling_params(max_tokens=400, ignore_eos=True, temperature=0.0)
    running = model.submit(model.prepare(prompt="tap"), params, lambda c: started.set())
    assert started.wait(30)
    result = model.generate(messages=_messages(_image(16)), max_tokens=3)
    model.cancel(running)
    assert result.usage.prompt_tokens > 24  # several chunks
    batcher_thread = {name for kind, name, _ in calls if kind == "decode"}
    assert all(name not in batcher_thread for kind, name, _ in calls if kind == "encode")
    on_batcher = [kind for kind, name, _ in calls if name in batcher_thread]
    first = on_batcher.index("prefill", 1)
    window = on_batcher[first:first + 2 * (result.usage.prompt_tokens // 8)]
    assert "prefill" in window and all(not (a == b == "prefill") for a, b in zip(window, window[1:])), window


@pytest.mark.requires_opencl
def test_the_vision_encoder_on_the_gpu_plan_equals_the_cpu_plan(vlm_folder: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixed backend speeds (a fast accelerator) make the offload the planner's choice on any machine;
    measured ones on a loaded 2-core host flip it."""
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.generation.vision.settings import VisionSettings
    from edge_runtime.planning.cost import BackendSpeed
    from edge_runtime.runtime import Runtime

    runtime = Runtime(RuntimeConfig(cache_dir=tmp_path / "cache", intra_op_threads=1))
    speeds = {"cpu": BackendSpeed("cpu", gflops=5.0, mem_gbps=5.0, launch_us=20.0, stage_us=20.0)}
    monkeypatch.setattr(runtime, "backend_speed", lambda name: speeds.get(name) or BackendSpeed(
        name, gflops=500.0, mem_gbps=200.0, launch_us=1.0, stage_us=5.0, copy_gbps=50.0))
    models = {plan: runtime.load_generative(vlm_folder, vision=VisionSettings(plan=plan)) for plan in ("cpu", "gpu")}
    try:
        gpu = models["gpu"].prompter.encoder.model
        assert gpu.report.backend_nodes.get(runtime.accelerator(), 0) > 0, gpu.report.reason
        for seed, size in ((17, (112, 84)), (18, (56, 168))):
            processed = models["cpu"].prompter.processor.process(_image(seed, *size))
            cpu_rows = models["cpu"].prompter.encoder.encode(processed.feeds, processed.num_tokens)
            gpu_rows = models["gpu"].prompter.encoder.encode(processed.feeds, processed.num_tokens)
            np.testing.assert_allclose(gpu_rows, cpu_rows, atol=1e-4, rtol=1e-4)
    finally:
        for model in models.values():
            model.close()
        runtime.close()
