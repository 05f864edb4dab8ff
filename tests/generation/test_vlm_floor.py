"""``tools/vlm_floor.py``: the FLOP counts behind ``bench_vlm``'s fp32 floor, against PyTorch's own counter.

The text prefill count is checked against ``FlopCounterMode`` running transformers' model with
eager attention (its score and value products are then matmuls the counter sees) on a prefill of
new tokens after a cache: the decoder layers' linear FLOPs must be exactly ours, and its attention
covers the whole [new, cached + new] rectangle of scores, of which ours keeps the causal part. The
vision count (the counter on transformers' tower) is checked against Qwen2-VL's count by hand.
"""

from __future__ import annotations

import math
import re

import pytest

from vlm_checkpoints import VLMSpec, checkpoint, load_model, sample_image, vlm_root

pytest.importorskip("torch")
pytest.importorskip("transformers")

SPECS = {"qwen2_vl": VLMSpec(family="qwen2_vl"), "glm4v": VLMSpec(family="glm4v", seed=4, image_size=112),
         "qwen3_vl": VLMSpec(family="qwen3_vl", seed=8, image_size=64, vision_depth=3)}
LAYER = re.compile(r"language_model\.layers\.\d+$")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return vlm_root(tmp_path_factory)


@pytest.mark.parametrize("family", sorted(SPECS))
@pytest.mark.parametrize("past,new", [(0, 9), (7, 5)])
def test_text_prefill_flops_match_the_counter(root, family: str, past: int, new: int) -> None:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from vlm_floor import text_linear_macs, text_prefill_flops

    model = load_model(checkpoint(SPECS[family], root))
    model.set_attn_implementation("eager")
    ids = torch.randint(20, 400, (1, past + new), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        cache = model(input_ids=ids[:, :past], use_cache=True).past_key_values if past else None
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids[:, past:], past_key_values=cache, use_cache=True)
    layers = {name: ops for name, ops in counter.get_flop_counts().items() if LAYER.search(name)}
    text = model.config.text_config
    assert len(layers) == text.num_hidden_layers
    counted = sum(sum(ops.values()) for ops in layers.values())
    attention = sum(flops for ops in layers.values() for op, flops in ops.items() if "bmm" in str(op))
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    rectangle = new * (past + new)
    assert attention == 4 * text.num_hidden_layers * text.num_attention_heads * head_dim * rectangle
    assert counted - attention == 2 * new * text_linear_macs(model)
    causal = new * past + new * (new + 1) // 2
    lm_head = 2 * model.lm_head.weight.numel()  # the last position only
    assert text_prefill_flops(model, new, past) == counted - attention + attention * causal // rectangle + lm_head


def test_vision_flops_equal_qwen2_vl_by_hand(root) -> None:
    import transformers

    from vlm_floor import vision_flops

    spec = SPECS["qwen2_vl"]
    folder = checkpoint(spec, root)
    model = load_model(folder)
    before = model.config.vision_config._attn_implementation
    pixels = transformers.Qwen2VLImageProcessor.from_pretrained(folder)(images=[sample_image()], return_tensors="pt")
    patches = int(pixels["image_grid_thw"].prod())
    d = spec.vision_dim
    expected = (2 * patches * d * 3 * 2 * 14 * 14                                   # patch embedding
                + spec.vision_depth * (2 * patches * 12 * d * d                      # qkv, proj, fc1, fc2
                                       + 4 * patches * patches * d)                  # scores and values
                + 2 * patches // 4 * (16 * d * d + 4 * d * spec.hidden))             # the 2x2 merger
    assert vision_flops(model, pixels["pixel_values"], pixels["image_grid_thw"]) == expected
    assert model.config.vision_config._attn_implementation == before  # the model is left as it was


@pytest.mark.parametrize("family", sorted(SPECS))
def test_vision_flops_count_every_patch_pair(root, family: str) -> None:
    """On every family the count is the counter's under SDPA (which misses the attention products) plus
    each block's scores and values over all patch pairs."""
    import torch
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    from vlm_floor import vision_flops

    spec = SPECS[family]
    folder = checkpoint(spec, root)
    model = load_model(folder)
    images = transformers.Glm4vImageProcessor if family == "glm4v" else transformers.Qwen2VLImageProcessor
    pixels = images.from_pretrained(folder)(images=[sample_image()], return_tensors="pt")
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model.model.get_image_features(pixels["pixel_values"], pixels["image_grid_thw"])
    patches = int(pixels["image_grid_thw"].prod())
    attention = spec.vision_depth * 4 * patches * patches * spec.vision_dim
    counted = vision_flops(model, pixels["pixel_values"], pixels["image_grid_thw"])
    assert counted == counter.get_total_flops() + attention


def test_gemm_peak_measures_both_engines() -> None:
    from vlm_floor import floor_ms, gemm_peak_gflops

    rates = gemm_peak_gflops(threads=1, rounds=1, repeat=1, n=128)
    assert set(rates) == {"onnxruntime", "torch"}
    assert all(math.isfinite(r) and r > 0 for r in rates.values())
    assert floor_ms(3e9, {"a": 1.0, "b": 2.0}) == pytest.approx(1500.0)  # the faster engine's rate


def test_step_floor_counts_only_what_the_caches_did_not_hold(root) -> None:
    from bench_vlm import step_floor
    from vlm_floor import text_prefill_flops

    model = load_model(checkpoint(SPECS["qwen2_vl"], root))
    edge = {"prompt_tokens": 40, "cached_tokens": 16, "images_cached": 1}
    row = step_floor(model, edge, images=3, image_flops=10**9, gflops={"x": 100.0}, transformers_ms=100.0)
    text = text_prefill_flops(model, 24, 16)
    assert row["vision_gflop"] == 2.0  # two of the three screenshots encoded
    assert row["text_gflop"] == round(text / 1e9, 1)
    assert row["ms"] == round((2e9 + text) / 100e9 * 1e3, 1)
    assert row["ratio_to_transformers"] == round(row["ms"] / 100.0, 3)
