"""The fused VLM decoder (``decoder_fused`` with ``inputs_embeds``; M-RoPE rotated outside
GroupQueryAttention) equals the unfused ``decoder_zoo`` graph on the same weights (issue 22).

The oracle is the plain-ONNX graph run by ONNX Runtime: logits and caches through a prompt in
chunks and two decode steps, with M-RoPE positions whose three rows differ (an image's grid)."""

from __future__ import annotations

import numpy as np
import pytest

STYLES = {  # (mrope_section or None, kv_heads, q/k/v biases): Qwen2-VL, Qwen2.5-VL's (same text model, wider
    # sections), Idefics3/SmolVLM (1-D RoPE, Llama: no biases)
    "qwen2-vl": ((2, 3, 3), 2, True),
    "qwen2.5-vl": ((4, 2, 2), 1, True),
    "idefics3": (None, 2, False),
}


def _session(proto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _positions(mrope: tuple[int, ...] | None, n: int) -> np.ndarray:
    """Text, a 3x4 image grid (temporal, height, width differ), text again: Qwen2-VL's rope index layout."""
    if mrope is None:
        return np.arange(n)[None]
    rows = [np.arange(3)] * 3
    grid = np.stack([np.zeros(12, int), np.repeat(np.arange(3), 4), np.tile(np.arange(4), 3)]) + 3
    tail = np.arange(n - 15) + 7
    return np.concatenate([np.stack(rows), grid, np.stack([tail] * 3)], axis=1)[:, None, :]


@pytest.mark.parametrize("style", list(STYLES))
def test_fused_vlm_logits_equal_unfused_through_chunked_prefill_and_decode(style: str) -> None:
    from edge_runtime.decoder_fused import build_fused_decoder
    from edge_runtime.decoder_zoo import DecoderShape, build_decoder, random_weights

    mrope, kv_heads, biases = STYLES[style]
    shape = DecoderShape(hidden=64, layers=2, heads=4, kv_heads=kv_heads, intermediate=96, vocab=300,
                         max_positions=64)
    weights = random_weights(shape, seed=7)
    if not biases:
        weights = {k: v for k, v in weights.items() if not k.endswith("_proj.bias")}
    weights["lm_head.weight"] = np.random.default_rng(8).standard_normal((300, 64)).astype(np.float32) * 0.2
    plain = _session(build_decoder(shape, weights, inputs_embeds=True, mrope_section=mrope))
    fused_proto = build_fused_decoder(shape, weights, inputs_embeds=True, mrope_section=mrope)
    assert any(node.op_type == "GroupQueryAttention" for node in fused_proto.graph.node)
    fused = _session(fused_proto)
    assert [(i.name, len(i.shape)) for i in fused.get_inputs()] == [(i.name, len(i.shape)) for i in plain.get_inputs()]
    assert [o.name for o in fused.get_outputs()] == [o.name for o in plain.get_outputs()]
    n = 22
    embeds = np.random.default_rng(1).standard_normal((1, n, shape.hidden)).astype(np.float32)
    positions = _positions(mrope, n)
    names = ["logits"] + [f"present.{i}.{k}" for i in range(shape.layers) for k in ("key", "value")]
    results = []
    for session in (plain, fused):
        past = [np.zeros((1, kv_heads, 0, shape.head_dim), np.float32)] * (2 * shape.layers)
        logits = []
        for start, end in ((0, 9), (9, 20), (20, 21), (21, 22)):  # a prompt in chunks, then two decode steps
            feeds = {"inputs_embeds": embeds[:, start:end], "attention_mask": np.ones((1, end), np.int64),
                     "position_ids": np.ascontiguousarray(positions[..., start:end])}
            feeds.update({f"past_key_values.{i}.{k}": past[2 * i + j] for i in range(shape.layers)
                          for j, k in enumerate(("key", "value"))})
            out = session.run(names, feeds)
            logits.append(out[0][0])
            past = out[1:]
        results.append((np.concatenate(logits), past))
    np.testing.assert_allclose(results[1][0], results[0][0], atol=1e-4, rtol=1e-4)
    for ours, theirs in zip(results[1][1], results[0][1]):  # the cache holds the same (rotated) keys and values
        np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=1e-5)
