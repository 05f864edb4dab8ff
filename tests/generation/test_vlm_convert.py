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

from vlm_checkpoints import VLMSpec, checkpoint, load_model, qwen_inputs, sample_image, vlm_root

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

QWEN = VLMSpec(family="qwen2_vl")


@pytest.fixture(scope="module")
def qwen_checkpoint(tmp_path_factory) -> Path:
    return checkpoint(QWEN, vlm_root(tmp_path_factory))


@pytest.fixture(scope="module")
def qwen_converted(qwen_checkpoint: Path, tmp_path_factory) -> Path:
    from edge_runtime.cli import main

    out = tmp_path_factory.mktemp("converted") / "qwen2_vl"
    assert main(["convert", str(qwen_checkpoint), "--to", "onnx", "--out", str(out)]) == 0
    return out


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


def test_converted_folder_has_the_transformers_js_layout(qwen_converted: Path) -> None:
    config = json.loads((qwen_converted / "config.json").read_text())
    assert config["model_type"] == "qwen2_vl"
    assert config["num_key_value_heads"] == config["text_config"]["num_key_value_heads"]  # flat, for transformers.js
    assert config["transformers.js_config"]["use_external_data_format"] == {"decoder_model_merged.onnx": 1}
    for name in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json", "generation_config.json",
                 "onnx/decoder_model_merged.onnx_data"):
        assert (qwen_converted / name).is_file(), name
    assert "<|image_pad|>" in json.loads((qwen_converted / "tokenizer_config.json").read_text())["chat_template"]
    names = {part: ([i.name for i in s.get_inputs()], [o.name for o in s.get_outputs()])
             for part in ("vision_encoder", "embed_tokens", "decoder_model_merged")
             for s in [session(qwen_converted, part)]}
    assert names["vision_encoder"] == (["pixel_values", "grid_thw"], ["image_features"])
    assert names["embed_tokens"] == (["input_ids"], ["inputs_embeds"])
    inputs, outputs = names["decoder_model_merged"]
    assert inputs[:3] == ["inputs_embeds", "attention_mask", "position_ids"]
    assert inputs[3:] == [f"past_key_values.{n}.{k}" for n in range(QWEN.layers) for k in ("key", "value")]
    assert outputs == ["logits"] + [f"present.{n}.{k}" for n in range(QWEN.layers) for k in ("key", "value")]


@pytest.mark.parametrize("grid", [[[1, 4, 6]], [[2, 4, 2]], [[1, 2, 4], [1, 6, 2]]], ids=["image", "t2", "two"])
def test_vision_features_equal_transformers(qwen_converted: Path, qwen_model, grid: list) -> None:
    grid = np.array(grid, np.int64)
    pixels = np.random.default_rng(1).standard_normal((int(np.prod(grid, axis=1).sum()), 1176)).astype(np.float32)
    ours = session(qwen_converted, "vision_encoder").run(None, {"pixel_values": pixels, "grid_thw": grid})[0]
    with torch.no_grad():
        theirs = qwen_model.model.visual(torch.from_numpy(pixels), grid_thw=torch.from_numpy(grid)).numpy()
    assert ours.shape == theirs.shape == (pixels.shape[0] // 4, QWEN.hidden)
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)


def test_processed_image_features_equal_get_image_features(qwen_converted: Path, qwen_model) -> None:
    inputs = qwen_inputs(qwen_converted, sample_image(), "what is on the screen")
    ours = session(qwen_converted, "vision_encoder").run(None, {"pixel_values": inputs["pixel_values"],
                                                                "grid_thw": inputs["image_grid_thw"]})[0]
    with torch.no_grad():
        theirs = qwen_model.model.get_image_features(torch.from_numpy(inputs["pixel_values"]),
                                                     torch.from_numpy(inputs["image_grid_thw"]))
    np.testing.assert_allclose(ours, torch.cat(theirs).numpy(), atol=1e-4, rtol=1e-4)


def test_embeddings_equal_transformers(qwen_converted: Path, qwen_model) -> None:
    ids = np.random.default_rng(2).integers(0, QWEN.vocab, (2, 7))
    ours = session(qwen_converted, "embed_tokens").run(None, {"input_ids": ids})[0]
    with torch.no_grad():
        theirs = qwen_model.get_input_embeddings()(torch.from_numpy(ids)).numpy()
    np.testing.assert_array_equal(ours, theirs)


def test_decoder_logits_with_mrope_prefill_and_decode_equal_transformers(qwen_converted: Path, qwen_model) -> None:
    """Batch of two (row 1 left-padded), M-RoPE positions that differ per axis; prefill 9, then 3 decode steps."""
    config = json.loads((qwen_converted / "config.json").read_text())
    rng = np.random.default_rng(3)
    total, prefill = 12, 9
    embeds = rng.standard_normal((2, total, QWEN.hidden)).astype(np.float32) * 0.2
    mask = np.ones((2, total), np.int64)
    mask[1, :2] = 0
    base = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    positions = np.stack([base, base // 2 + (base > 4) * 3, base % 3 + base // 3]).astype(np.int64)
    with torch.no_grad():
        theirs = qwen_model(inputs_embeds=torch.from_numpy(embeds), attention_mask=torch.from_numpy(mask),
                            position_ids=torch.from_numpy(positions)).logits.numpy()
    decoder = session(qwen_converted, "decoder_model_merged")
    past = empty_past(config, 2)
    names = [o.name for o in decoder.get_outputs()]
    start = 0
    for stop in (prefill, 10, 11, 12):
        feeds = {"inputs_embeds": embeds[:, start:stop], "attention_mask": mask[:, :stop],
                 "position_ids": positions[:, :, start:stop], **past}
        outputs = dict(zip(names, decoder.run(None, feeds)))
        np.testing.assert_allclose(outputs["logits"][0], theirs[0, start:stop], atol=1e-3, rtol=1e-3)
        valid = slice(max(start, 2) - start, stop - start)  # row 1's padded queries are undefined
        np.testing.assert_allclose(outputs["logits"][1, valid], theirs[1, max(start, 2):stop], atol=1e-3, rtol=1e-3)
        past = {k.replace("present", "past_key_values"): v for k, v in outputs.items() if k.startswith("present")}
        start = stop


def onnx_greedy(folder: Path, model, inputs: dict[str, np.ndarray], max_new: int) -> list[int]:
    """The host loop over our three parts: embed, encode, splice at image_token_id, prefill, decode."""
    config = json.loads((folder / "config.json").read_text())
    eos = set(json.loads((folder / "generation_config.json").read_text())["eos_token_id"])
    ids = inputs["input_ids"]
    embeds = session(folder, "embed_tokens").run(None, {"input_ids": ids})[0]
    features = session(folder, "vision_encoder").run(None, {"pixel_values": inputs["pixel_values"],
                                                           "grid_thw": inputs["image_grid_thw"]})[0]
    rows = ids[0] == config["image_token_id"]
    assert rows.sum() == len(features)
    embeds[0, rows] = features
    with torch.no_grad():  # transformers' get_rope_index: the positions oracle (the engine has its own)
        positions, delta = model.model.get_rope_index(torch.from_numpy(ids), torch.from_numpy(inputs["image_grid_thw"]),
                                                      None, torch.from_numpy(inputs["attention_mask"]))
    positions, delta = positions.numpy(), int(delta[0, 0])
    decoder, embed = session(folder, "decoder_model_merged"), session(folder, "embed_tokens")
    names = [o.name for o in decoder.get_outputs()]
    feeds = {"inputs_embeds": embeds, "attention_mask": np.ones_like(ids), "position_ids": positions,
             **empty_past(config, 1)}
    tokens: list[int] = []
    length = ids.shape[1]
    while True:
        outputs = dict(zip(names, decoder.run(None, feeds)))
        token = int(np.argmax(outputs["logits"][0, -1]))
        tokens.append(token)
        if token in eos or len(tokens) == max_new:
            return tokens
        past = {k.replace("present", "past_key_values"): v for k, v in outputs.items() if k.startswith("present")}
        feeds = {"inputs_embeds": embed.run(None, {"input_ids": np.array([[token]], np.int64)})[0],
                 "attention_mask": np.ones((1, length + 1), np.int64),
                 "position_ids": np.full((3, 1, 1), length + delta, np.int64), **past}
        length += 1


def test_greedy_tokens_equal_transformers_generate(qwen_converted: Path, qwen_model) -> None:
    inputs = qwen_inputs(qwen_converted, sample_image(seed=5), "tap the settings button")
    with torch.no_grad():
        generated = qwen_model.generate(**{k: torch.from_numpy(v) for k, v in inputs.items()}, max_new_tokens=16,
                                        do_sample=False)
    expected = generated[0, inputs["input_ids"].shape[1]:].tolist()
    ours = onnx_greedy(qwen_converted, qwen_model, inputs, 16)
    assert ours == expected
    assert len(set(expected)) > 3  # varied tokens: a broken part would not hide behind one repeated token


def test_convert_refuses_unknown_model_types(tmp_path: Path, capsys) -> None:
    from edge_runtime.cli import main

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "llava"}))
    assert main(["convert", str(tmp_path / "ckpt"), "--to", "onnx", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "'llava'" in err and "qwen2_vl, qwen2_5_vl, idefics3, smolvlm" in err
    assert main(["convert", str(tmp_path / "ckpt"), "--to", "onnx"]) == 2
    assert "--out" in capsys.readouterr().err
