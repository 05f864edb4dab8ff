"""The converter (``edge-runtime convert HF --to onnx``) and the torch-free VLM graphs against transformers.

Tiny random-weight checkpoints built with torch (``vlm_checkpoints``) are converted;
each part is compared with the same weights in transformers (vision features, embeddings,
decoder logits with M-RoPE positions, prefill then decode with past), and greedy tokens
from a small onnxruntime loop over the three parts equal ``generate(do_sample=False)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from vlm_checkpoints import (MROPE_FAMILIES, QWEN3_4B_HEADS, QWEN_FAMILIES, VLMSpec, checkpoint, deepstack_sets,
                             empty_past, load_model, model_inputs, onnx_greedy, patch_values, sample_image, session,
                             vision_feeds, vlm_root, widened)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SPECS = {"qwen2_vl": VLMSpec(family="qwen2_vl"), "idefics3": VLMSpec(family="idefics3", seed=1),
         "smolvlm": VLMSpec(family="smolvlm", seed=2),
         "qwen2_5_vl": VLMSpec(family="qwen2_5_vl", seed=3, vision_depth=3),
         "glm4v": VLMSpec(family="glm4v", seed=4, image_size=112),
         "qwen3_vl": VLMSpec(family="qwen3_vl", seed=8, image_size=64, vision_depth=3)}
# GLM-4.1V-9B's head geometry: 128 channels, 64 rotated as mrope [8, 12, 12]; vision heads of 128; a 24x24 table
GLM_REAL_HEADS = VLMSpec(family="glm4v", seed=5, hidden=256, heads=2, kv_heads=1, intermediate=256, vision_dim=256,
                         vision_heads=2, image_size=336)
QWEN = SPECS["qwen2_vl"]
PARTS = ("vision_encoder", "embed_tokens", "decoder_model_merged")


@pytest.fixture(scope="module", params=sorted(SPECS))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def hf(family: str, tmp_path_factory) -> Path:
    return checkpoint(SPECS[family], vlm_root(tmp_path_factory))


@pytest.fixture(scope="module")
def converted(family: str, hf: Path, tmp_path_factory) -> Path:
    from edge_runtime.cli import main

    out = tmp_path_factory.mktemp("converted") / family
    assert main(["convert", str(hf), "--to", "onnx", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def model(hf: Path):
    return load_model(hf)


@pytest.fixture(scope="module")
def qwen_checkpoint(tmp_path_factory) -> Path:
    return checkpoint(QWEN, vlm_root(tmp_path_factory))


@pytest.fixture(scope="module")
def qwen_converted(qwen_checkpoint: Path, tmp_path_factory) -> Path:
    from edge_runtime.vision_convert import convert_vlm_folder

    return convert_vlm_folder(qwen_checkpoint, tmp_path_factory.mktemp("converted") / "qwen2_vl")


@pytest.fixture(scope="module")
def qwen_model(qwen_checkpoint: Path):
    return load_model(qwen_checkpoint)


def test_converted_folder_has_the_transformers_js_layout(family: str, converted: Path) -> None:
    config = json.loads((converted / "config.json").read_text())
    spec = SPECS[family]
    assert config["model_type"] == family
    if family in QWEN_FAMILIES:  # transformers.js reads Qwen2-VL's text sizes at the top level
        assert config["num_key_value_heads"] == config["text_config"]["num_key_value_heads"]
    # every part's weights beside its graph (ONNX Runtime maps them), listed for transformers.js
    assert config["transformers.js_config"]["use_external_data_format"] == {f"{part}.onnx": 1 for part in PARTS}
    files = ["tokenizer.json", "tokenizer_config.json", "preprocessor_config.json", "generation_config.json",
             *(f"onnx/{part}.onnx_data" for part in PARTS)] + ([] if family in MROPE_FAMILIES
                                                                else ["processor_config.json"])
    for name in files:
        assert (converted / name).is_file(), name
    placeholder = {"glm4v": "<|image|>", "qwen3_vl": "<|image_pad|>"}.get(
        family, "<|image_pad|>" if family in QWEN_FAMILIES else "<image>")
    assert placeholder in json.loads((converted / "tokenizer_config.json").read_text())["chat_template"]
    names = {part: ([i.name for i in s.get_inputs()], [o.name for o in s.get_outputs()])
             for part in ("vision_encoder", "embed_tokens", "decoder_model_merged")
             for s in [session(converted, part)]}
    second = {"qwen2_vl": "grid_thw", "qwen2_5_vl": "image_grid_thw", "glm4v": "image_grid_thw",
              "qwen3_vl": "image_grid_thw"}.get(family, "pixel_attention_mask")
    assert names["vision_encoder"] == (["pixel_values", second], ["image_features"])
    assert names["embed_tokens"] == (["input_ids"], ["inputs_embeds"])
    inputs, outputs = names["decoder_model_merged"]
    assert inputs[:3] == ["inputs_embeds", "attention_mask", "position_ids"]
    assert inputs[3:] == [f"past_key_values.{n}.{k}" for n in range(spec.layers) for k in ("key", "value")]
    assert outputs == ["logits"] + [f"present.{n}.{k}" for n in range(spec.layers) for k in ("key", "value")]


GRIDS = {"image": [[1, 4, 6]], "t2": [[2, 8, 6]], "two": [[1, 10, 6], [1, 4, 4]], "tall": [[1, 16, 2]]}
# transformers' Glm4vVisionEmbeddings reads a clip's second frame as a second image's shape: no oracle for t2
VISION_CASES = [(family, name) for family in MROPE_FAMILIES for name in GRIDS if (family, name) != ("glm4v", "t2")]


@pytest.mark.parametrize("family, grid", [(f, GRIDS[name]) for f, name in VISION_CASES], indirect=["family"],
                         ids=[f"{f}-{name}" for f, name in VISION_CASES])
def test_qwen_vision_features_equal_transformers(family: str, converted: Path, model, grid: list) -> None:
    """Grids of an image, a 2-frame clip (attention per frame), two images in one call and a strip;
    Qwen2.5-VL's windows (2x2 merge blocks here) cut these grids into full and partial windows;
    GLM-4.1V resamples its 8x8 position table to each grid (smaller, larger, 16x2), Qwen3-VL its 4x4 one
    (bilinearly) and appends its DeepStack sets."""
    grid = np.array(grid, np.int64)
    pixels = np.random.default_rng(1).standard_normal((int(np.prod(grid, axis=1).sum()),
                                                       patch_values(family))).astype(np.float32)
    feeds = vision_feeds(family, {"pixel_values": pixels, "image_grid_thw": grid})
    ours = session(converted, "vision_encoder").run(None, feeds)[0]
    with torch.no_grad():
        theirs = widened(model.model.visual(torch.from_numpy(pixels), grid_thw=torch.from_numpy(grid))).numpy()
    assert ours.shape == theirs.shape == (pixels.shape[0] // 4, SPECS[family].hidden * (1 + deepstack_sets(family)))
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["idefics3"], indirect=True)
def test_idefics_position_buckets_for_every_valid_area(converted: Path, model) -> None:
    """Tiles whose valid areas are 1..8 patches a side (the graph buckets in integers, transformers in
    float32 with a 1 - 1e-6 shrink): features equal for each."""
    size = SPECS["idefics3"].image_size
    areas = [(8, 8), (1, 1), (3, 7), (5, 2), (7, 8), (8, 3), (2, 5), (6, 6), (4, 1)]
    pixels = np.random.default_rng(7).standard_normal((1, len(areas), 3, size, size)).astype(np.float32)
    mask = np.zeros((1, len(areas), size, size), bool)
    for tile, (rows, cols) in enumerate(areas):
        mask[0, tile, :rows * 4 - 1, :cols * 4 - 2] = True  # partial last patches still count
    ours = session(converted, "vision_encoder").run(None, {"pixel_values": pixels, "pixel_attention_mask": mask})[0]
    with torch.no_grad():
        theirs = model.model.get_image_features(torch.from_numpy(pixels), torch.from_numpy(mask)).numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["idefics3", "smolvlm"], indirect=True)
def test_idefics_vision_features_with_padding_equal_transformers(converted: Path, model) -> None:
    """Three tiles: one whole, one padded at the bottom right (partial patches), one all-zero padding tile."""
    size = SPECS["idefics3"].image_size
    pixels = np.random.default_rng(1).standard_normal((1, 3, 3, size, size)).astype(np.float32)
    pixels[0, 2] = 0
    mask = np.ones((1, 3, size, size), bool)
    mask[0, 1, 21:] = False
    mask[0, 1, :, 10:] = False
    mask[0, 2] = False
    ours = session(converted, "vision_encoder").run(None, {"pixel_values": pixels, "pixel_attention_mask": mask})[0]
    with torch.no_grad():
        theirs = model.model.get_image_features(torch.from_numpy(pixels), torch.from_numpy(mask)).numpy()
    assert ours.shape == theirs.shape == (2, (size // 4) ** 2 // 4, SPECS["idefics3"].hidden)
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)


def test_processed_image_features_equal_get_image_features(family: str, converted: Path, model) -> None:
    inputs = model_inputs(family, converted, sample_image(), "what is on the screen")
    ours = session(converted, "vision_encoder").run(None, vision_feeds(family, inputs))[0]
    with torch.no_grad():
        theirs = model.model.get_image_features(*(torch.from_numpy(v) for v in vision_feeds(family, inputs).values()))
    if family == "qwen3_vl":  # (per-image merger rows, DeepStack sets)
        theirs = widened((torch.cat(theirs[0]), theirs[1]))
    theirs = torch.cat(theirs) if isinstance(theirs, (tuple, list)) else theirs
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-4, rtol=1e-4)


def test_embeddings_equal_transformers(family: str, converted: Path, model) -> None:
    ids = np.random.default_rng(2).integers(0, SPECS[family].vocab, (2, 7))
    ours = session(converted, "embed_tokens").run(None, {"input_ids": ids})[0]
    with torch.no_grad():
        theirs = model.get_input_embeddings()(torch.from_numpy(ids)).numpy()
    hidden = SPECS[family].hidden
    assert ours.shape == (2, 7, hidden * (1 + deepstack_sets(family)))
    np.testing.assert_array_equal(ours[..., :hidden], theirs)
    assert not ours[..., hidden:].any()  # Qwen3-VL: text rows carry no DeepStack features


def test_decoder_logits_prefill_and_decode_equal_transformers(family: str, hf: Path, converted: Path, model,
                                                             tmp_path: Path) -> None:
    """Batch of two, row 1 two tokens shorter; prefill 9, then 3 decode steps with past. Qwen: M-RoPE
    positions [3, batch, seq] that differ per axis; Idefics3/SmolVLM: [batch, seq]. The default graph
    (GroupQueryAttention) takes row 1 right-padded (its valid cache positions first, as
    ``kv_inplace`` keeps them); the ``--portable-attention`` graph takes it left-padded."""
    from edge_runtime.cli import main
    from edge_runtime.generation.folder import appends_in_place

    config = json.loads((converted / "config.json").read_text())
    rng = np.random.default_rng(3)
    total, hidden = 12, SPECS[family].hidden
    embeds = rng.standard_normal((2, total, hidden * (1 + deepstack_sets(family)))).astype(np.float32) * 0.2
    visual = np.zeros((2, total), bool)
    visual[:, 3:8] = True  # Qwen3-VL: DeepStack features on these rows only, zero on the text rows
    embeds[..., hidden:][~visual] = 0
    mask = np.ones((2, total), np.int64)
    mask[1, :2] = 0
    base = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    if family in MROPE_FAMILIES:
        positions = np.stack([base, base // 2 + (base > 4) * 3, base % 3 + base // 3]).astype(np.int64)
    else:
        positions = base.astype(np.int64)
    theirs = _reference_logits(family, model, embeds, mask, positions, visual)
    if family == "qwen3_vl":  # the DeepStack sets change the logits: dropping them would fail below
        dropped = embeds.copy()
        dropped[..., hidden:] = 0
        assert np.abs(_reference_logits(family, model, dropped, mask, positions, visual) - theirs)[:, -1].max() > 1e-2
    portable = tmp_path / "portable"
    assert main(["convert", str(hf), "--to", "onnx", "--out", str(portable), "--portable-attention"]) == 0
    folders = {"fused": converted, "portable": portable}
    for kind, folder in folders.items():
        proto = onnx.load(str(folder / "onnx" / "decoder_model_merged.onnx"), load_external_data=False)
        assert appends_in_place(proto) == (kind == "fused"), kind
        _check_padded_batch(session(folder, "decoder_model_merged"), empty_past(config, 2), embeds, mask, positions,
                            theirs, right_padded=kind == "fused")


def _reference_logits(family: str, model, embeds: np.ndarray, mask: np.ndarray, positions: np.ndarray,
                      visual: np.ndarray) -> np.ndarray:
    """transformers' logits for widened ``embeds``: Qwen3-VL's DeepStack sets passed as its language model takes
    them (``visual_pos_masks`` and one [visual rows, hidden] tensor per set)."""
    hidden = SPECS[family].hidden
    tensors = {"attention_mask": torch.from_numpy(mask), "position_ids": torch.from_numpy(positions)}
    with torch.no_grad():
        if family != "qwen3_vl":
            return model(inputs_embeds=torch.from_numpy(embeds), **tensors).logits.numpy()
        sets = [torch.from_numpy(embeds[visual][:, hidden * (1 + i):hidden * (2 + i)])
                for i in range(deepstack_sets(family))]
        states = model.model.language_model(inputs_embeds=torch.from_numpy(embeds[..., :hidden].copy()),
                                            visual_pos_masks=torch.from_numpy(visual), deepstack_visual_embeds=sets,
                                            **tensors).last_hidden_state
        return model.lm_head(states).numpy()


def _check_padded_batch(decoder, past: dict, embeds: np.ndarray, mask: np.ndarray, positions: np.ndarray,
                        theirs: np.ndarray, right_padded: bool) -> None:
    names = [o.name for o in decoder.get_outputs()]
    pad = int((mask[1] == 0).sum())
    if right_padded:  # row 1's valid tokens moved to the front, its padding to the end of the prompt
        embeds, positions, mask = embeds.copy(), positions.copy(), mask.copy()
        embeds[1] = np.roll(embeds[1], -pad, axis=0)
        positions[..., 1, :] = np.roll(positions[..., 1, :], -pad, axis=-1)
    start = 0
    for stop in (9, 10, 11, 12):
        if right_padded:  # row 1: the prompt's first 9 - pad tokens, then one token a step at its own length
            row = stop - pad if stop > 9 else 9
            feeds_embeds = np.stack([embeds[0, start:stop], embeds[1, row - (stop - start):row]])
            feeds_pos = np.stack([positions[..., 0, start:stop], positions[..., 1, row - (stop - start):row]], axis=-2)
            feeds_mask = np.zeros((2, stop), np.int64)
            feeds_mask[0], feeds_mask[1, :stop - pad] = 1, 1
        else:
            feeds_embeds, feeds_pos, feeds_mask = embeds[:, start:stop], positions[..., start:stop], mask[:, :stop]
        feeds = {"inputs_embeds": np.ascontiguousarray(feeds_embeds), "attention_mask": feeds_mask,
                 "position_ids": np.ascontiguousarray(feeds_pos), **past}
        outputs = dict(zip(names, decoder.run(None, feeds)))
        np.testing.assert_allclose(outputs["logits"][0], theirs[0, start:stop], atol=1e-3, rtol=1e-3)
        if right_padded:  # the prefill's last pad queries are undefined; each step's one query is row 1's next
            valid = slice(0, 9 - pad) if start == 0 else slice(0, 1)
            expected = theirs[1, pad:9] if start == 0 else theirs[1, stop - 1:stop]
        else:
            valid = slice(max(start, pad) - start, stop - start)  # row 1's padded queries are undefined
            expected = theirs[1, max(start, pad):stop]
        np.testing.assert_allclose(outputs["logits"][1, valid], expected, atol=1e-3, rtol=1e-3)
        past = {k.replace("present", "past_key_values"): v for k, v in outputs.items() if k.startswith("present")}
        start = stop


@pytest.mark.parametrize("size", [(84, 56), (40, 48), (140, 112)], ids=["wide", "tall", "windows"])
def test_greedy_tokens_equal_transformers_generate(family: str, converted: Path, model, size: tuple) -> None:
    inputs = model_inputs(family, converted, sample_image(*size, seed=5), "tap the settings button")
    with torch.no_grad():
        generated = model.generate(**{k: torch.from_numpy(v) for k, v in inputs.items()}, max_new_tokens=16,
                                   do_sample=False)
    expected = generated[0, inputs["input_ids"].shape[1]:].tolist()
    assert onnx_greedy(family, converted, model, inputs, 16) == expected
    assert len(set(expected)) > 3  # varied tokens: a broken part would not hide behind one repeated token


def test_fp16_variants_stay_close_and_finite_with_padding(family: str, hf: Path, tmp_path: Path) -> None:
    """``--fp16``: every part also as ``_fp16`` (float32 I/O); vision features within 1 % of fp32 (with a
    padded tile for Idefics3/SmolVLM), and decoder outputs finite for a left-padded batch, last logits
    within 2 % of fp32."""
    from edge_runtime.cli import main

    folder = tmp_path / "fp16"
    assert main(["convert", str(hf), "--to", "onnx", "--out", str(folder), "--precision", "fp16", "--json"]) == 0
    rng = np.random.default_rng(4)
    if family in MROPE_FAMILIES:
        inputs = {"pixel_values": rng.standard_normal((24, patch_values(family))).astype(np.float32),
                  "image_grid_thw": np.array([[1, 4, 6]], np.int64)}
    else:
        size = SPECS[family].image_size
        mask = np.ones((1, 2, size, size), bool)
        mask[0, 1, 19:] = False
        inputs = {"pixel_values": rng.standard_normal((1, 2, 3, size, size)).astype(np.float32),
                  "pixel_attention_mask": mask}
    full, half = (session(folder, part).run(None, vision_feeds(family, inputs))[0]
                  for part in ("vision_encoder", "vision_encoder_fp16"))
    np.testing.assert_allclose(half, full, atol=0.01 * np.abs(full).max())
    config = json.loads((folder / "config.json").read_text())
    assert config["transformers.js_config"]["use_external_data_format"] == {
        f"{part}{suffix}.onnx": 1 for part in PARTS for suffix in ("", "_fp16")}
    mask = np.ones((2, 6), np.int64)
    mask[1, :3] = 0
    base = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    feeds = {"inputs_embeds": rng.standard_normal((2, 6, SPECS[family].hidden * (1 + deepstack_sets(family))
                                                   )).astype(np.float32) * 0.2,
             "attention_mask": mask, "position_ids": np.stack([base] * 3) if family in MROPE_FAMILIES else base,
             **empty_past(config, 2)}
    decoder = session(folder, "decoder_model_merged_fp16")
    outputs = dict(zip([o.name for o in decoder.get_outputs()], decoder.run(None, feeds)))
    assert all(np.isfinite(v).all() for v in outputs.values())
    full_logits = session(folder, "decoder_model_merged").run(["logits"], feeds)[0]
    np.testing.assert_allclose(outputs["logits"][:, -1], full_logits[:, -1], atol=0.02 * np.abs(full_logits).max())


def test_convert_refuses_unknown_model_types(tmp_path: Path, capsys) -> None:
    from edge_runtime.cli import main

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "llava"}))
    assert main(["convert", str(tmp_path / "ckpt"), "--to", "onnx", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "'llava'" in err and "qwen2_vl, qwen2_5_vl, idefics3, smolvlm, glm4v" in err
    assert main(["convert", str(tmp_path / "ckpt"), "--to", "onnx"]) == 2
    assert "--out" in capsys.readouterr().err


def test_large_model_path_external_data_for_every_part(qwen_checkpoint: Path, qwen_model, tmp_path: Path,
                                                       monkeypatch) -> None:
    """Large parts are checked from their saved file, not in memory, and keep weights in ``<file>_data``
    (the limit lowered here so a tiny model takes the path a real checkpoint takes)."""
    from edge_runtime import model_zoo, vlm_parts
    from edge_runtime.vision_convert import convert_vlm_folder

    for module in (model_zoo, vlm_parts):
        monkeypatch.setattr(module, "IN_MEMORY_CHECK_BYTES", 4096)
    folder = convert_vlm_folder(qwen_checkpoint, tmp_path / "large")
    parts = ("vision_encoder", "embed_tokens", "decoder_model_merged")
    config = json.loads((folder / "config.json").read_text())
    assert config["transformers.js_config"]["use_external_data_format"] == {f"{p}.onnx": 1 for p in parts}
    assert all((folder / "onnx" / f"{p}.onnx_data").is_file() for p in parts)
    inputs = model_inputs("qwen2_vl", folder, sample_image(seed=5), "tap the settings button")
    with torch.no_grad():
        generated = qwen_model.generate(**{k: torch.from_numpy(v) for k, v in inputs.items()}, max_new_tokens=8,
                                        do_sample=False)
    expected = generated[0, inputs["input_ids"].shape[1]:].tolist()
    assert onnx_greedy("qwen2_vl", folder, qwen_model, inputs, 8) == expected


def test_convert_refuses_scaled_rope_and_missing_weights(qwen_checkpoint: Path, tmp_path: Path) -> None:
    import shutil

    from edge_runtime.errors import ModelLoadError
    from edge_runtime.vision_convert import convert_vlm_folder

    broken = tmp_path / "ckpt"
    shutil.copytree(qwen_checkpoint, broken)
    config = json.loads((broken / "config.json").read_text())
    config["text_config"]["rope_scaling"] = {"rope_type": "yarn", "factor": 2.0, "mrope_section": [2, 3, 3]}
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="rope_scaling type 'yarn' is not supported"):
        convert_vlm_folder(broken, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before writing anything
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no model.safetensors"):
        convert_vlm_folder(broken, tmp_path / "out")


@pytest.mark.parametrize("grid", [[[1, 1, 1]], [[0, 0, 0]], [[5, 7, 3]], [[1, 4, 6], [1, 1, 1]]])
def test_qwen_vision_encoder_is_total_on_grids_that_do_not_match(qwen_converted: Path, grid: list) -> None:
    """The planner probes graphs with synthetic inputs: a grid that disagrees with the 24 patch rows must not
    fail a Gather or divide by zero (which would kill the process); the host validates real inputs."""
    pixels = np.random.default_rng(0).standard_normal((24, 1176)).astype(np.float32)
    out = session(qwen_converted, "vision_encoder").run(None, {"pixel_values": pixels,
                                                              "grid_thw": np.array(grid, np.int64)})[0]
    assert out.shape == (6, QWEN.hidden)


def test_legacy_flat_config_bf16_shards_convert(qwen_checkpoint: Path, tmp_path: Path) -> None:
    """The shape of released Qwen2-VL checkpoints: text fields flat at the top level (no text_config),
    ``rope_scaling.type == "mrope"``, bfloat16 weights in two shards with an index; the oracle is
    transformers loading that same folder in float32."""
    import shutil

    from safetensors.torch import load_file, save_file

    from edge_runtime.vision_convert import convert_vlm_folder

    legacy = tmp_path / "legacy"
    shutil.copytree(qwen_checkpoint, legacy)
    config = json.loads((legacy / "config.json").read_text())
    text = config.pop("text_config")
    text.pop("model_type")
    text["rope_scaling"] = {"type": "mrope", "mrope_section": text["rope_scaling"]["mrope_section"]}
    config.update(text, architectures=["Qwen2VLForConditionalGeneration"], torch_dtype="bfloat16")
    config.pop("dtype", None)
    (legacy / "config.json").write_text(json.dumps(config))
    weights = {k: v.to(torch.bfloat16) for k, v in load_file(str(legacy / "model.safetensors")).items()}
    (legacy / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: weights[k].contiguous() for k in keys}, str(legacy / shard), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (legacy / "model.safetensors.index.json").write_text(json.dumps(index))
    folder = convert_vlm_folder(legacy, tmp_path / "out")
    model = load_model(legacy)
    assert next(model.parameters()).dtype == torch.float32
    inputs = model_inputs("qwen2_vl", folder, sample_image(seed=5), "tap the settings button")
    with torch.no_grad():
        generated = model.generate(**{k: torch.from_numpy(v) for k, v in inputs.items()}, max_new_tokens=12,
                                   do_sample=False)
    expected = generated[0, inputs["input_ids"].shape[1]:].tolist()
    assert onnx_greedy("qwen2_vl", folder, model, inputs, 12) == expected
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == QWEN.layers


def test_glm_at_its_real_head_geometry_equals_transformers(tmp_path_factory, tmp_path: Path) -> None:
    """GLM-4.1V-9B's head sizes (text heads of 128 channels, half rotated, M-RoPE [8, 12, 12]; vision heads
    of 128) and its 24x24 position table, at two layers: vision features and greedy tokens equal
    transformers'."""
    from edge_runtime.vision_convert import convert_vlm_folder

    hf = checkpoint(GLM_REAL_HEADS, vlm_root(tmp_path_factory))
    config = json.loads((hf / "config.json").read_text())
    assert config["text_config"]["rope_scaling"]["mrope_section"] == [8, 12, 12]
    folder = convert_vlm_folder(hf, tmp_path / "glm")
    model = load_model(hf)
    inputs = model_inputs("glm4v", folder, sample_image(140, 308, seed=2), "tap the search field")
    ours = session(folder, "vision_encoder").run(None, vision_feeds("glm4v", inputs))[0]
    with torch.no_grad():
        theirs = model.model.get_image_features(torch.from_numpy(inputs["pixel_values"]),
                                                torch.from_numpy(inputs["image_grid_thw"]))
        generated = model.generate(**{k: torch.from_numpy(v) for k, v in inputs.items()}, max_new_tokens=12,
                                   do_sample=False)
    theirs = torch.cat(theirs).numpy()
    # float32 sums in another order: features of magnitude ~30 at these widths differ by ~1e-4 of that
    np.testing.assert_allclose(ours, theirs, atol=1e-4 * np.abs(theirs).max(), rtol=1e-4)
    expected = generated[0, inputs["input_ids"].shape[1]:].tolist()
    assert onnx_greedy("glm4v", folder, model, inputs, 12) == expected
    assert len(set(expected)) > 3


def test_qwen3_vl_at_4b_head_geometry_equals_transformers(tmp_path_factory, tmp_path: Path) -> None:
    """Qwen3-VL-4B's head sizes (text heads of 128 channels wider than hidden / heads, M-RoPE [24, 20, 20]
    interleaved; vision heads of 64) with its 48x48 position table and three DeepStack sets: vision features
    and greedy tokens equal transformers', fused and portable."""
    from edge_runtime.vision_convert import convert_vlm_folder

    hf = checkpoint(QWEN3_4B_HEADS, vlm_root(tmp_path_factory))
    config = json.loads((hf / "config.json").read_text())
    assert config["text_config"]["rope_scaling"]["mrope_section"] == [24, 20, 20]
    assert config["text_config"]["head_dim"] * 2 != config["text_config"]["hidden_size"]
    model = load_model(hf)
    inputs = model_inputs("qwen3_vl", hf, sample_image(160, 320, seed=2), "tap the search field")
    with torch.no_grad():
        theirs = widened(model.model.visual(torch.from_numpy(inputs["pixel_values"]),
                                            grid_thw=torch.from_numpy(inputs["image_grid_thw"]))).numpy()
        generated = model.generate(**{k: torch.from_numpy(v) for k, v in inputs.items()}, max_new_tokens=12,
                                   do_sample=False)
    expected = generated[0, inputs["input_ids"].shape[1]:].tolist()
    for fused in (True, False):
        folder = convert_vlm_folder(hf, tmp_path / f"fused-{fused}", fused=fused)
        ours = session(folder, "vision_encoder").run(None, vision_feeds("qwen3_vl", inputs))[0]
        assert ours.shape == theirs.shape == (inputs["pixel_values"].shape[0] // 4, 4 * 160)
        # features reach ~65 here: float32 rounding alone puts transformers' own run 3e-4 from its float64 one
        np.testing.assert_allclose(ours, theirs, atol=1e-5 * np.abs(theirs).max(), rtol=1e-4)
        assert onnx_greedy("qwen3_vl", folder, model, inputs, 12) == expected, fused
    assert len(set(expected)) > 3
