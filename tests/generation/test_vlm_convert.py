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
import pytest

from vlm_checkpoints import VLMSpec, checkpoint, load_model, model_inputs, sample_image, vlm_root

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SPECS = {"qwen2_vl": VLMSpec(family="qwen2_vl"), "idefics3": VLMSpec(family="idefics3", seed=1),
         "smolvlm": VLMSpec(family="smolvlm", seed=2),
         "qwen2_5_vl": VLMSpec(family="qwen2_5_vl", seed=3, vision_depth=3)}
QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl")
QWEN = SPECS["qwen2_vl"]


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


def session(folder: Path, part: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(folder / "onnx" / f"{part}.onnx"), options, providers=["CPUExecutionProvider"])


def empty_past(config: dict, batch: int) -> dict[str, np.ndarray]:
    text = config.get("text_config", config)
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    return {f"past_key_values.{n}.{kind}": np.zeros((batch, text["num_key_value_heads"], 0, head_dim), np.float32)
            for n in range(text["num_hidden_layers"]) for kind in ("key", "value")}


def test_converted_folder_has_the_transformers_js_layout(family: str, converted: Path) -> None:
    config = json.loads((converted / "config.json").read_text())
    spec = SPECS[family]
    assert config["model_type"] == family
    if family in QWEN_FAMILIES:  # transformers.js reads Qwen2-VL's text sizes at the top level
        assert config["num_key_value_heads"] == config["text_config"]["num_key_value_heads"]
    assert config["transformers.js_config"]["use_external_data_format"] == {"decoder_model_merged.onnx": 1}
    files = ["tokenizer.json", "tokenizer_config.json", "preprocessor_config.json", "generation_config.json",
             "onnx/decoder_model_merged.onnx_data"] + ([] if family in QWEN_FAMILIES else ["processor_config.json"])
    for name in files:
        assert (converted / name).is_file(), name
    placeholder = "<|image_pad|>" if family in QWEN_FAMILIES else "<image>"
    assert placeholder in json.loads((converted / "tokenizer_config.json").read_text())["chat_template"]
    names = {part: ([i.name for i in s.get_inputs()], [o.name for o in s.get_outputs()])
             for part in ("vision_encoder", "embed_tokens", "decoder_model_merged")
             for s in [session(converted, part)]}
    second = {"qwen2_vl": "grid_thw", "qwen2_5_vl": "image_grid_thw"}.get(family, "pixel_attention_mask")
    assert names["vision_encoder"] == (["pixel_values", second], ["image_features"])
    assert names["embed_tokens"] == (["input_ids"], ["inputs_embeds"])
    inputs, outputs = names["decoder_model_merged"]
    assert inputs[:3] == ["inputs_embeds", "attention_mask", "position_ids"]
    assert inputs[3:] == [f"past_key_values.{n}.{k}" for n in range(spec.layers) for k in ("key", "value")]
    assert outputs == ["logits"] + [f"present.{n}.{k}" for n in range(spec.layers) for k in ("key", "value")]


@pytest.mark.parametrize("family", QWEN_FAMILIES, indirect=True)
@pytest.mark.parametrize("grid", [[[1, 4, 6]], [[2, 8, 6]], [[1, 10, 6], [1, 4, 4]]], ids=["image", "t2", "two"])
def test_qwen_vision_features_equal_transformers(family: str, converted: Path, model, grid: list) -> None:
    """Grids of an image, a 2-frame clip (attention per frame) and two images in one call; Qwen2.5-VL's
    windows (2x2 merge blocks here) cut these grids into full and partial windows."""
    grid = np.array(grid, np.int64)
    pixels = np.random.default_rng(1).standard_normal((int(np.prod(grid, axis=1).sum()), 1176)).astype(np.float32)
    feeds = vision_feeds(family, {"pixel_values": pixels, "image_grid_thw": grid})
    ours = session(converted, "vision_encoder").run(None, feeds)[0]
    with torch.no_grad():
        theirs = model.model.visual(torch.from_numpy(pixels), grid_thw=torch.from_numpy(grid)).numpy()
    assert ours.shape == theirs.shape == (pixels.shape[0] // 4, SPECS[family].hidden)
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


def vision_feeds(family: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if family in QWEN_FAMILIES:
        grid_name = "grid_thw" if family == "qwen2_vl" else "image_grid_thw"
        return {"pixel_values": inputs["pixel_values"], grid_name: inputs["image_grid_thw"]}
    return {"pixel_values": inputs["pixel_values"], "pixel_attention_mask": inputs["pixel_attention_mask"]}


def test_processed_image_features_equal_get_image_features(family: str, converted: Path, model) -> None:
    inputs = model_inputs(family, converted, sample_image(), "what is on the screen")
    ours = session(converted, "vision_encoder").run(None, vision_feeds(family, inputs))[0]
    with torch.no_grad():
        theirs = model.model.get_image_features(*(torch.from_numpy(v) for v in vision_feeds(family, inputs).values()))
    theirs = torch.cat(theirs) if isinstance(theirs, (tuple, list)) else theirs
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-4, rtol=1e-4)


def test_embeddings_equal_transformers(family: str, converted: Path, model) -> None:
    ids = np.random.default_rng(2).integers(0, SPECS[family].vocab, (2, 7))
    ours = session(converted, "embed_tokens").run(None, {"input_ids": ids})[0]
    with torch.no_grad():
        theirs = model.get_input_embeddings()(torch.from_numpy(ids)).numpy()
    np.testing.assert_array_equal(ours, theirs)


def test_decoder_logits_prefill_and_decode_equal_transformers(family: str, converted: Path, model) -> None:
    """Batch of two (row 1 left-padded); prefill 9, then 3 decode steps with past. Qwen: M-RoPE positions
    [3, batch, seq] that differ per axis; Idefics3/SmolVLM: [batch, seq]."""
    config = json.loads((converted / "config.json").read_text())
    rng = np.random.default_rng(3)
    total = 12
    embeds = rng.standard_normal((2, total, SPECS[family].hidden)).astype(np.float32) * 0.2
    mask = np.ones((2, total), np.int64)
    mask[1, :2] = 0
    base = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    if family in QWEN_FAMILIES:
        positions = np.stack([base, base // 2 + (base > 4) * 3, base % 3 + base // 3]).astype(np.int64)
    else:
        positions = base.astype(np.int64)
    with torch.no_grad():
        theirs = model(inputs_embeds=torch.from_numpy(embeds), attention_mask=torch.from_numpy(mask),
                       position_ids=torch.from_numpy(positions)).logits.numpy()
    decoder = session(converted, "decoder_model_merged")
    past = empty_past(config, 2)
    names = [o.name for o in decoder.get_outputs()]
    start = 0
    for stop in (9, 10, 11, 12):
        feeds = {"inputs_embeds": embeds[:, start:stop], "attention_mask": mask[:, :stop],
                 "position_ids": positions[..., start:stop], **past}
        outputs = dict(zip(names, decoder.run(None, feeds)))
        np.testing.assert_allclose(outputs["logits"][0], theirs[0, start:stop], atol=1e-3, rtol=1e-3)
        valid = slice(max(start, 2) - start, stop - start)  # row 1's padded queries are undefined
        np.testing.assert_allclose(outputs["logits"][1, valid], theirs[1, max(start, 2):stop], atol=1e-3, rtol=1e-3)
        past = {k.replace("present", "past_key_values"): v for k, v in outputs.items() if k.startswith("present")}
        start = stop


def onnx_greedy(family: str, folder: Path, model, inputs: dict[str, np.ndarray], max_new: int) -> list[int]:
    """The host loop over our three parts: embed, encode, splice at image_token_id, prefill, decode."""
    config = json.loads((folder / "config.json").read_text())
    eos = set(json.loads((folder / "generation_config.json").read_text())["eos_token_id"])
    ids = inputs["input_ids"]
    embeds = session(folder, "embed_tokens").run(None, {"input_ids": ids})[0]
    features = session(folder, "vision_encoder").run(None, vision_feeds(family, inputs))[0]
    features = features.reshape(-1, features.shape[-1])
    rows = ids[0] == config["image_token_id"]
    assert rows.sum() == len(features)
    embeds[0, rows] = features
    length, delta = ids.shape[1], 0
    if family in QWEN_FAMILIES:
        with torch.no_grad():  # transformers' get_rope_index: the positions oracle (the engine has its own)
            positions, deltas = model.model.get_rope_index(
                input_ids=torch.from_numpy(ids), image_grid_thw=torch.from_numpy(inputs["image_grid_thw"]),
                attention_mask=torch.from_numpy(inputs["attention_mask"]))
        positions, delta = positions.numpy(), int(deltas[0, 0])
    else:
        positions = np.arange(length, dtype=np.int64)[None]
    decoder, embed = session(folder, "decoder_model_merged"), session(folder, "embed_tokens")
    names = [o.name for o in decoder.get_outputs()]
    feeds = {"inputs_embeds": embeds, "attention_mask": np.ones_like(ids), "position_ids": positions,
             **empty_past(config, 1)}
    tokens: list[int] = []
    while True:
        outputs = dict(zip(names, decoder.run(None, feeds)))
        token = int(np.argmax(outputs["logits"][0, -1]))
        tokens.append(token)
        if token in eos or len(tokens) == max_new:
            return tokens
        past = {k.replace("present", "past_key_values"): v for k, v in outputs.items() if k.startswith("present")}
        position = np.full((3, 1, 1) if family in QWEN_FAMILIES else (1, 1), length + delta, np.int64)
        feeds = {"inputs_embeds": embed.run(None, {"input_ids": np.array([[token]], np.int64)})[0],
                 "attention_mask": np.ones((1, length + 1), np.int64), "position_ids": position, **past}
        length += 1


@pytest.mark.parametrize("size", [(84, 56), (40, 48), (140, 112)], ids=["wide", "tall", "windows"])
def test_greedy_tokens_equal_transformers_generate(family: str, converted: Path, model, size: tuple) -> None:
    inputs = model_inputs(family, converted, sample_image(*size, seed=5), "tap the settings button")
    with torch.no_grad():
        generated = model.generate(**{k: torch.from_numpy(v) for k, v in inputs.items()}, max_new_tokens=16,
                                   do_sample=False)
    expected = generated[0, inputs["input_ids"].shape[1]:].tolist()
    assert onnx_greedy(family, converted, model, inputs, 16) == expected
    assert len(set(expected)) > 3  # varied tokens: a broken part would not hide behind one repeated token


def test_fp16_variants_load_and_stay_close(qwen_checkpoint: Path, tmp_path: Path) -> None:
    from edge_runtime.vision_convert import convert_vlm_folder

    folder = convert_vlm_folder(qwen_checkpoint, tmp_path / "fp16", fp16=True)
    grid = np.array([[1, 4, 4]], np.int64)
    pixels = np.random.default_rng(4).standard_normal((16, 1176)).astype(np.float32)
    full, half = (session(folder, part).run(None, {"pixel_values": pixels, "grid_thw": grid})[0]
                  for part in ("vision_encoder", "vision_encoder_fp16"))
    np.testing.assert_allclose(half, full, atol=0.05 * np.abs(full).max())
    config = json.loads((folder / "config.json").read_text())
    assert config["transformers.js_config"]["use_external_data_format"] == {
        "decoder_model_merged.onnx": 1, "decoder_model_merged_fp16.onnx": 1}


def test_convert_refuses_unknown_model_types(tmp_path: Path, capsys) -> None:
    from edge_runtime.cli import main

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "llava"}))
    assert main(["convert", str(tmp_path / "ckpt"), "--to", "onnx", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "'llava'" in err and "qwen2_vl, qwen2_5_vl, idefics3, smolvlm" in err
    assert main(["convert", str(tmp_path / "ckpt"), "--to", "onnx"]) == 2
    assert "--out" in capsys.readouterr().err
