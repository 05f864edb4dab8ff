"""The fused vision encoders (ONNX Runtime's ``MultiHeadAttention``) equal the portable ones (issue 22).

``fused=True`` rewrites only the attention of each tower: q/k/v stay [batch, seq, hidden],
ORT's contrib op replaces MatMul + bias + Softmax + MatMul, and an ``If`` drops the bias
(or key mask) when the call holds one frame (or no padded patch), where ORT's CPU kernel
runs flash attention. The oracle is the portable graph on the same weights, run by ONNX
Runtime: that graph is the one the converter tests prove equal to transformers. Both
branches of every ``If`` are exercised: one image (the fast branch), several images or
frames, windowed blocks and padded tiles (the biased branch).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

SEED = 5


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _ops(model: onnx.ModelProto) -> set[tuple[str, str]]:
    """(domain, op_type) of every node, inside If branches too."""
    found, graphs = set(), [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            found.add((node.domain, node.op_type))
            graphs += [attr.g for attr in node.attribute if attr.type == onnx.AttributeProto.GRAPH]
    return found


def _assert_same(fused: onnx.ModelProto, portable: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    want, got = _run(portable, feeds), _run(fused, feeds)
    assert got.shape == want.shape
    scale = max(float(np.max(np.abs(want))), 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)


def _check_forms(fused: onnx.ModelProto, portable: onnx.ModelProto) -> None:
    assert ("com.microsoft", "MultiHeadAttention") in _ops(fused) and ("", "Softmax") not in _ops(fused)
    assert not any(domain for domain, _ in _ops(portable)) and ("", "Softmax") in _ops(portable)


def _qwen_towers(family: str) -> tuple[onnx.ModelProto, onnx.ModelProto, int, str]:
    rng = np.random.default_rng(SEED)
    if family == "qwen2_vl":
        from edge_runtime.vision_graphs import QwenVisionSpec, build_qwen2_vl_vision
        from edge_runtime.vlm_zoo import _qwen_vision_weights

        spec = QwenVisionSpec(depth=3)
        weights = _qwen_vision_weights(spec, rng)
        build = lambda fused: build_qwen2_vl_vision(spec, weights, fused=fused)  # noqa: E731
        grid_name = "grid_thw"
    elif family == "glm4v":  # its position table resampled to every grid, in both forms
        from edge_runtime.vision_graphs_glm4v import GlmVisionSpec, build_glm4v_vision
        from edge_runtime.vlm_parts import vision_weights
        from edge_runtime.vlm_zoo import _glm_vision_weights

        spec = GlmVisionSpec(depth=3)
        weights = vision_weights("glm4v", _glm_vision_weights(spec, rng))
        build = lambda fused: build_glm4v_vision(spec, weights, fused=fused)  # noqa: E731
        grid_name = "image_grid_thw"
    elif family == "qwen3_vl":  # bilinear position table, DeepStack sets from blocks 0 and 2
        from edge_runtime.vision_graphs_qwen3vl import Qwen3VisionSpec, build_qwen3_vl_vision
        from edge_runtime.vlm_parts import vision_weights
        from edge_runtime.vlm_zoo import _qwen3_vision_weights

        spec = Qwen3VisionSpec(depth=3, deepstack=(0, 2))
        weights = vision_weights("qwen3_vl", _qwen3_vision_weights(spec, rng))
        build = lambda fused: build_qwen3_vl_vision(spec, weights, fused=fused)  # noqa: E731
        grid_name = "image_grid_thw"
    else:
        from edge_runtime.vision_graphs_qwen25 import (Qwen25VisionSpec, build_qwen2_5_vl_vision,
                                                       random_qwen25_vision_weights)

        spec = Qwen25VisionSpec(depth=3, fullatt_blocks=(1,))  # windowed, full, windowed
        weights = random_qwen25_vision_weights(spec, rng)
        build = lambda fused: build_qwen2_5_vl_vision(spec, weights, fused=fused)  # noqa: E731
        grid_name = "image_grid_thw"
    return build(True), build(False), spec.patch_values, grid_name


# (t, h, w) rows of one call: one image (the host's case), two images, a two-frame clip, an image
# 8x12 patches = 2x3 windows of Qwen2.5-VL's 2x2 merge blocks, and one smaller than a window
GRIDS = [[[1, 8, 12]], [[1, 8, 12], [1, 4, 6]], [[2, 6, 4]], [[1, 2, 2]]]


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "glm4v", "qwen3_vl"])
def test_fused_qwen_tower_equals_portable(family: str) -> None:
    fused, portable, values, grid_name = _qwen_towers(family)
    _check_forms(fused, portable)
    rng = np.random.default_rng(SEED + 1)
    for grid in GRIDS:
        patches = sum(t * h * w for t, h, w in grid)
        feeds = {"pixel_values": rng.standard_normal((patches, values)).astype(np.float32),
                 grid_name: np.array(grid, np.int64)}
        _assert_same(fused, portable, feeds)


def test_fused_qwen_tower_keeps_images_apart() -> None:
    """Two images in one call give each image's features alone (the biased branch confines attention)."""
    fused, _, values, grid_name = _qwen_towers("qwen2_vl")
    rng = np.random.default_rng(SEED + 2)
    first, second = (rng.standard_normal((n, values)).astype(np.float32) for n in (96, 24))
    both = _run(fused, {"pixel_values": np.concatenate([first, second]),
                        grid_name: np.array([[1, 8, 12], [1, 4, 6]], np.int64)})
    alone = [_run(fused, {"pixel_values": pixels, grid_name: np.array([grid], np.int64)})
             for pixels, grid in ((first, [1, 8, 12]), (second, [1, 4, 6]))]
    np.testing.assert_allclose(both, np.concatenate(alone), rtol=1e-4, atol=1e-5)


def test_fused_smolvlm_tower_equals_portable() -> None:
    from edge_runtime.vision_graphs_idefics import (IdeficsVisionSpec, build_idefics3_vision,
                                                    random_idefics_vision_weights)

    spec = IdeficsVisionSpec(layers=2)
    weights = random_idefics_vision_weights(spec, np.random.default_rng(SEED))
    fused, portable = build_idefics3_vision(spec, weights, fused=True), build_idefics3_vision(spec, weights)
    _check_forms(fused, portable)
    size, rng = spec.image_size, np.random.default_rng(SEED + 3)
    pixels = rng.standard_normal((1, 3, 3, size, size)).astype(np.float32)
    whole = np.ones((1, 3, size, size), bool)
    _assert_same(fused, portable, {"pixel_values": pixels, "pixel_attention_mask": whole})  # no padded patch
    padded = whole.copy()  # a tile padded at the bottom right (partial patches) and an all-zero padding tile
    padded[0, 1, 21:] = False
    padded[0, 1, :, 10:] = False
    padded[0, 2] = False
    pixels[0, 2] = 0
    _assert_same(fused, portable, {"pixel_values": pixels, "pixel_attention_mask": padded})


def test_fused_encoder_runs_on_the_cpu_plan(tmp_path: Path) -> None:
    """A gpu plan's backends cannot take the contrib ops: a fused encoder is loaded with plan cpu."""
    from edge_runtime.generation.vision.encoder import VisionEncoder

    fused, portable, _, _ = _qwen_towers("qwen2_vl")
    asked = []

    class Loaded:
        def close(self) -> None:
            return None

    def loader(path: Path, plan: str, shapes: dict, sample: dict) -> Loaded:
        asked.append((path.name, plan))
        return Loaded()

    for name, model in (("fused.onnx", fused), ("portable.onnx", portable)):
        onnx.save(model, tmp_path / name)
        VisionEncoder(tmp_path / name, 64, loader=loader, plan="gpu").close()
    assert asked == [("fused.onnx", "cpu"), ("portable.onnx", "gpu")]


def test_convert_writes_fused_attention_unless_portable_is_asked(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``convert --to onnx``: the fused encoder by default, standard ops with --portable-attention; the same
    features from both on a real processed image (transformers' checkpoint, converted twice)."""
    pytest.importorskip("torch")
    from vlm_checkpoints import VLMSpec, checkpoint, model_inputs, sample_image, session, vision_feeds, vlm_root

    from edge_runtime.cli import main

    hf = checkpoint(VLMSpec(family="qwen2_vl"), vlm_root(tmp_path_factory))
    root = tmp_path_factory.mktemp("converted")
    assert main(["convert", str(hf), "--to", "onnx", "--out", str(root / "fused")]) == 0
    assert main(["convert", str(hf), "--to", "onnx", "--out", str(root / "portable"), "--portable-attention"]) == 0
    fused, portable = (onnx.load(str(root / kind / "onnx" / "vision_encoder.onnx")) for kind in ("fused", "portable"))
    _check_forms(fused, portable)
    feeds = vision_feeds("qwen2_vl", model_inputs("qwen2_vl", root / "fused", sample_image(), "what is shown"))
    want, got = (session(root / kind, "vision_encoder").run(None, feeds)[0] for kind in ("portable", "fused"))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(float(np.max(np.abs(want))), 1.0))
