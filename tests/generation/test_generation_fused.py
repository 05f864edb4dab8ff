"""The fused decoder graph (``decoder_fused``: GroupQueryAttention) and its in-place KV cache (``kv_inplace``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from generation_fixtures import oracle_greedy

MESSAGES = [{"role": "user", "content": "open the settings menu then scroll down"}]


def _session(proto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("style", ["qwen2-gqa", "llama-mha"])
def test_fused_logits_equal_unfused_through_chunked_prefill(style: str) -> None:
    from edge_runtime.decoder_fused import build_fused_decoder
    from edge_runtime.decoder_zoo import DecoderShape, build_decoder, random_weights

    kv_heads = 2 if style == "qwen2-gqa" else 4
    shape = DecoderShape(hidden=64, layers=2, heads=4, kv_heads=kv_heads, intermediate=96, vocab=300, max_positions=64)
    weights = random_weights(shape, seed=5)
    if style == "llama-mha":  # Llama: no q/k/v biases, an untied head
        weights = {k: v for k, v in weights.items() if not k.endswith("_proj.bias")}
        weights["lm_head.weight"] = np.random.default_rng(6).standard_normal((300, 64)).astype(np.float32) * 0.2
    plain, fused = _session(build_decoder(shape, weights)), _session(build_fused_decoder(shape, weights))
    ids = np.random.default_rng(0).integers(0, shape.vocab, (1, 13))
    names = ["logits"] + [f"present.{n}.{k}" for n in range(shape.layers) for k in ("key", "value")]
    results = []
    for session in (plain, fused):
        past = [np.zeros((1, kv_heads, 0, shape.head_dim), np.float32)] * (2 * shape.layers)
        logits = []
        for start, end in ((0, 6), (6, 11), (11, 12), (12, 13)):  # a prompt in chunks, then two decode steps
            feeds = {"input_ids": ids[:, start:end], "attention_mask": np.ones((1, end), np.int64),
                     "position_ids": np.arange(start, end)[None]}
            feeds.update({f"past_key_values.{n}.{k}": past[2 * n + i] for n in range(shape.layers)
                          for i, k in enumerate(("key", "value"))})
            out = session.run(names, feeds)
            logits.append(out[0][0])
            past = out[1:]
        results.append((np.concatenate(logits), past))
    np.testing.assert_allclose(results[1][0], results[0][0], atol=1e-4, rtol=1e-4)
    for ours, theirs in zip(results[1][1], results[0][1]):  # the cache holds the same (rotated) keys and values
        np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=1e-5)


def test_fused_greedy_equals_the_optimum_exports_no_cache_oracle(fused_folder: Path, onnx_folder: Path,
                                                                model_factory) -> None:
    model = model_factory(fused_folder, max_batch_size=2, prefill_chunk_tokens=8)
    assert model.folder.kv_in_place and type(model.engine.kv).__name__ == "InPlaceKV"
    result = model.generate(messages=MESSAGES, max_tokens=24)
    ids = model.prepare(messages=MESSAGES).ids
    eos = set(model.folder.eos_token_ids)
    assert list(result.token_ids) == oracle_greedy(onnx_folder, ids, 24, eos)  # independent graph, no cache
    assert list(result.token_ids) == oracle_greedy(fused_folder, ids, 24, eos)  # and its own graph, no cache


def test_unfused_graph_stays_selectable_and_generates_the_same(fused_folder: Path, hf_model_folder: Path,
                                                              tmp_path: Path, model_factory) -> None:
    from edge_runtime.decoder_zoo import decoder_folder_from_hf

    plain = model_factory(decoder_folder_from_hf(hf_model_folder, tmp_path / "plain", fused=False), max_batch_size=2)
    fused = model_factory(fused_folder, max_batch_size=2)
    assert not plain.folder.kv_in_place and type(plain.engine.kv).__name__ == "BatchKV"
    assert plain.generate(messages=MESSAGES, max_tokens=16).token_ids == \
        fused.generate(messages=MESSAGES, max_tokens=16).token_ids
    # one buffer per layer tensor instead of two, and the memory budget plans what the load allocates
    assert fused.kv_cache_bytes * 2 == plain.kv_cache_bytes
    from edge_runtime.generation.footprint import planned_footprint

    for model in (plain, fused):
        assert planned_footprint(model.folder.path, model.settings, 1.0).kv_cache_bytes == model.kv_cache_bytes


def test_a_decode_step_appends_in_place_without_copying_the_cache(fused_folder: Path, model_factory) -> None:
    model = model_factory(fused_folder, max_batch_size=2, prefix_cache_bytes=0)
    engine, kv = model.engine, model.engine.kv
    prompts = [model.prepare("tap the button").ids, model.prepare("open the settings menu and scroll").ids]
    joining = [engine.prefill(p, None)[1] for p in prompts]
    with model.batcher._wake:  # keep the batcher's thread out while the test drives the engine
        kv.rebuild([], joining)
        lengths = kv.lengths()
        before = [a.copy() for a in kv.past()]
        engine.decode([5, 7])
        after = kv.past()
        outputs = engine._binding.get_outputs()  # present.N.key/value in binding order, then logits
        for i, (flat, old, new) in enumerate(zip(kv._flat, before, after)):
            assert outputs[i].data_ptr() == flat.ctypes.data  # present is the preallocated buffer itself
            for row, n in enumerate(lengths):
                np.testing.assert_array_equal(new[row, :, :n], old[row, :, :n])  # the past was not touched
                assert np.abs(new[row, :, n]).sum() > 0  # the new token was written at the row's own length
        assert kv.lengths() == [n + 1 for n in lengths]
        kv.rebuild([], [])


def test_in_place_layout_moves_rows_and_hands_back_their_kv() -> None:
    from edge_runtime.generation.folder import KVLayout
    from edge_runtime.generation.kv_inplace import InPlaceKV, buffer_bytes

    layout = KVLayout(layers=1, kv_heads=2, head_dim=3, dtype=np.float32)
    kv = InPlaceKV(layout, max_batch=3, max_len=8)
    assert kv.nbytes == buffer_bytes(layout, 3, 8)
    rng = np.random.default_rng(0)
    seqs = [[rng.standard_normal((1, 2, n, 3)).astype(np.float32) for _ in range(2)] for n in (2, 5, 4)]
    assert kv.rebuild([], seqs, [0, 0, 7]) == [0, 1, 2]
    assert kv.lengths() == [2, 5, 4] and kv.positions() == [2, 5, 11]
    np.testing.assert_array_equal(kv.attention_mask(), (np.arange(6)[None] <= np.array([[2], [5], [4]])).astype(int))
    assert kv.rebuild([0, 2], []) == []  # row 1 leaves; row 2 moves up
    assert kv.lengths() == [2, 4] and kv.positions() == [2, 11]
    for row, seq in zip((0, 1), (seqs[0], seqs[2])):
        for got, want in zip(kv.row_kv(row), seq):
            np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="exceeds the cache"):
        kv.rebuild([0], [[np.zeros((1, 2, 9, 3), np.float32)] * 2])


def test_a_shape_onnx_runtime_cannot_fuse_gets_the_unfused_graph(tmp_path: Path) -> None:
    from edge_runtime.decoder_fused import build_fused_decoder
    from edge_runtime.decoder_zoo import DecoderShape, random_weights, write_decoder_folder
    from edge_runtime.generation.folder import read_folder

    shape = DecoderShape(hidden=32, heads=4, kv_heads=2, intermediate=64, vocab=300, max_positions=64)  # head_dim 8
    with pytest.raises(ValueError, match="head_dim 8 is not a multiple of 16"):
        build_fused_decoder(shape, random_weights(shape))
    assert not read_folder(write_decoder_folder(tmp_path / "small", shape)).kv_in_place
    assert read_folder(write_decoder_folder(tmp_path / "fused", DecoderShape(vocab=300, max_positions=64))).kv_in_place


def test_a_fused_graph_without_position_ids_still_batches(fused_folder: Path, onnx_folder: Path, tmp_path: Path,
                                                          model_factory) -> None:
    """onnxruntime-genai's graphs take no position_ids: GroupQueryAttention rotates each row at its own length."""
    import shutil
    import threading

    import onnx

    folder = tmp_path / "no-positions"
    shutil.copytree(fused_folder, folder)
    proto = onnx.load(str(folder / "model.onnx"))
    for node in proto.graph.node:
        if node.op_type == "GroupQueryAttention":
            node.input[9] = ""  # no position_ids: positions come from seqlens_k
    inputs = [v for v in proto.graph.input if v.name != "position_ids"]
    del proto.graph.input[:]
    proto.graph.input.extend(inputs)
    onnx.save(proto, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    model = model_factory(folder, max_batch_size=3, prefill_chunk_tokens=8, prefix_cache_bytes=0)
    assert not model.folder.has_position_ids and model.engine.kv.max_batch == 3
    from edge_runtime.generation.model import sampling_params

    rows_seen: list[int] = []
    decode = model.engine.decode
    model.engine.decode = lambda tokens: (rows_seen.append(len(tokens)), decode(tokens))[1]
    prompts = [model.prepare(p).ids for p in ("tap", "open the settings menu and scroll down", "json name")]
    tokens: list[list[int]] = [[] for _ in prompts]
    done = [threading.Event() for _ in prompts]

    def sink(i: int):
        return lambda chunk: (tokens[i].extend(chunk.token_ids), chunk.finish_reason and done[i].set())

    params = sampling_params(max_tokens=10, ignore_eos=True, temperature=0.0)
    with model.batcher._wake:  # all three queued before the loop admits any: they share decode steps
        for i, ids in enumerate(prompts):
            model.submit(model.prepare(ids), params, sink(i))
    assert all(event.wait(60) for event in done)
    assert max(rows_seen) == 3  # rows of three different lengths in one call
    for ids, got in zip(prompts, tokens):
        assert got == oracle_greedy(onnx_folder, ids, 10, set())
