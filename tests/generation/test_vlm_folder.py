"""Reading a VLM folder: recognition, per-part precision from [vision], the decoder's KV layout, the charge,
what a screenshot costs under the image budget."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.errors import ConfigError, ModelLoadError


@pytest.fixture(scope="module")
def fp16_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge_runtime.vlm_zoo import write_vlm_folder

    return write_vlm_folder(tmp_path_factory.mktemp("qwen16"), "qwen2_vl", seed=2, fp16=True)


def test_a_vlm_folder_is_generative_and_reads_its_parts(fp16_folder: Path) -> None:
    import json

    import onnx

    from edge_runtime.generation.folder import is_generative_folder
    from edge_runtime.generation.vision.folder import is_vlm_folder, read_vlm_folder

    assert is_generative_folder(fp16_folder) and is_vlm_folder(fp16_folder)
    vlm = read_vlm_folder(fp16_folder)
    assert vlm.precisions == {"decoder": "fp32", "embed_tokens": "fp32", "vision_encoder": "fp32"}  # the default
    assert vlm.decoder.model_path.name == "decoder_model_merged.onnx" and vlm.mrope
    config = json.loads((fp16_folder / "config.json").read_text())
    text = config["text_config"]
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    assert (vlm.decoder.kv.layers, vlm.decoder.kv.kv_heads, vlm.decoder.kv.head_dim) == (
        text["num_hidden_layers"], text["num_key_value_heads"], head_dim)
    assert vlm.image_token_id == config["image_token_id"] and vlm.hidden_size == text["hidden_size"]
    stems = {p.name for p in vlm.decoder.weight_files}
    for part in (vlm.decoder.model_path, vlm.embed_path, vlm.vision_path):
        assert part.name in stems
        external = {e.value for t in onnx.load(str(part), load_external_data=False).graph.initializer
                    for e in t.external_data if e.key == "location"}
        assert external <= stems
    assert vlm.weight_bytes == sum(p.stat().st_size for p in vlm.decoder.weight_files)


def test_precision_per_part_picks_the_files(fp16_folder: Path) -> None:
    from edge_runtime.generation.vision.folder import read_vlm_folder
    from edge_runtime.generation.vision.settings import VisionSettings, vision_settings

    settings = vision_settings({"vision": {"precision": {"decoder": "fp16", "vision_encoder": "fp16"}}}, "test")
    vlm = read_vlm_folder(fp16_folder, settings)
    assert vlm.decoder.model_path.name == "decoder_model_merged_fp16.onnx"
    assert vlm.vision_path.name == "vision_encoder_fp16.onnx" and vlm.embed_path.name == "embed_tokens.onnx"
    with pytest.raises(ModelLoadError, match=r"precision.decoder = 'q4'.*decoder_model_merged_q4.onnx.*fp16"):
        read_vlm_folder(fp16_folder, VisionSettings(precision={"decoder": "q4"}))
    with pytest.raises(ConfigError, match="unknown part"):
        VisionSettings(precision={"lm_head": "fp16"})
    with pytest.raises(ConfigError, match="plan"):
        vision_settings({"vision": {"plan": "npu"}}, "test")


def test_fp16_parts_generate_as_the_oracle_over_the_same_files(fp16_folder: Path) -> None:
    from PIL import Image

    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.generation.vision.settings import VisionSettings
    from vlm_oracle import Oracle

    vision = VisionSettings(precision={"decoder": "fp16", "vision_encoder": "fp16", "embed_tokens": "fp16"})
    model = GenerativeModel("q16", fp16_folder, GenerationSettings(max_seq_len=512, prefill_chunk_tokens=8),
                            threads=1, vision=vision)
    try:
        image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (84, 112, 3), dtype=np.uint8))
        request = {"prompt": "Read the screen.", "images": [image]}
        result = model.generate(**request, max_tokens=8, ignore_eos=True)
        prepared = model.prepare(**request)
        processed = [model.prompter.processor.process(image)]
        assert list(result.token_ids) == Oracle(model).greedy(prepared.ids, processed, 8)
    finally:
        model.close()


def test_planned_footprint_charges_all_three_parts(fp16_folder: Path) -> None:
    from edge_runtime.generation.footprint import planned_footprint
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.generation.vision.folder import read_vlm_folder

    settings = GenerationSettings(max_seq_len=256, max_batch_size=2)
    planned = planned_footprint(fp16_folder, settings, 1.0)
    vlm = read_vlm_folder(fp16_folder)
    assert planned.weights_bytes == vlm.weight_bytes
    # one KV buffer appended in place (the GroupQueryAttention decoder) or two, ping-pong (the portable one)
    buffers = 1 if vlm.decoder.kv_in_place else 2
    assert vlm.decoder.kv_in_place  # the zoo's default decoder
    assert planned.kv_cache_bytes == buffers * 2 * 256 * vlm.decoder.kv.bytes_per_token


def test_token_embedder_reads_a_plain_gather_table_and_runs_anything_else(fp16_folder: Path, tmp_path: Path) -> None:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from edge_runtime.generation.vision.embeddings import TokenEmbedder
    from edge_runtime.generation.vision.folder import read_vlm_folder

    vlm = read_vlm_folder(fp16_folder)
    ids = [0, 5, 17, vlm.image_token_id, 3]
    session = ort.InferenceSession(str(vlm.embed_path), providers=["CPUExecutionProvider"])
    expected = session.run(["inputs_embeds"], {"input_ids": np.array([ids], np.int64)})[0][0]
    table = TokenEmbedder(vlm.embed_path, np.float32)
    assert table.table is not None and table.session is None
    np.testing.assert_array_equal(table.embed(ids), expected)
    # A graph that is not a bare Gather (a scaled embedding, as Gemma's) runs in a session.
    weights = np.random.default_rng(0).standard_normal((32, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["rows"]),
         helper.make_node("Mul", ["rows", "scale"], ["inputs_embeds"])], "scaled",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT, ["b", "s", 8])],
        [numpy_helper.from_array(weights, "table"), numpy_helper.from_array(np.float32(2.0), "scale")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "scaled.onnx")
    scaled = TokenEmbedder(tmp_path / "scaled.onnx", np.float32)
    assert scaled.table is None and scaled.session is not None
    np.testing.assert_allclose(scaled.embed([1, 31, 4]), weights[[1, 31, 4]] * 2)
    # A table in external data is memory-mapped from its file, not copied.
    plain = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["inputs_embeds"])], "plain",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT, ["b", "s", 8])],
        [numpy_helper.from_array(np.zeros(3, np.float32), "padding"), numpy_helper.from_array(weights, "table")])
    onnx.save(helper.make_model(plain, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "plain.onnx",
              save_as_external_data=True, all_tensors_to_one_file=True, location="plain.onnx_data", size_threshold=0)
    mapped = TokenEmbedder(tmp_path / "plain.onnx", np.float32)
    assert isinstance(mapped.table, np.memmap)
    np.testing.assert_array_equal(mapped.embed([0, 31, 7]), weights[[0, 31, 7]])


def test_token_embedder_reads_a_widened_qwen3_vl_table_in_numpy(tmp_path: Path) -> None:
    """Qwen3-VL's ``embed_tokens`` pads each row with zeros for the DeepStack sets: the engine still takes rows in
    numpy (no session run per decode step), equal to ONNX Runtime's output for the graph."""
    import onnxruntime as ort

    from edge_runtime.generation.vision.embeddings import PaddedTable, TokenEmbedder
    from edge_runtime.generation.vision.folder import read_vlm_folder
    from edge_runtime.vlm_zoo import write_vlm_folder

    vlm = read_vlm_folder(write_vlm_folder(tmp_path / "qwen3", "qwen3_vl", seed=3))
    ids = [0, 5, 17, vlm.image_token_id, 3]
    expected = ort.InferenceSession(str(vlm.embed_path), providers=["CPUExecutionProvider"]).run(
        ["inputs_embeds"], {"input_ids": np.array([ids], np.int64)})[0][0]
    embedder = TokenEmbedder(vlm.embed_path, np.float32)
    assert isinstance(embedder.table, PaddedTable) and embedder.session is None
    assert vlm.hidden_size == expected.shape[1] == 3 * 64  # hidden + two DeepStack sets
    np.testing.assert_array_equal(embedder.embed(ids), expected)


def test_the_load_says_what_a_screenshot_costs_under_the_budget(tmp_path: Path, caplog) -> None:
    """A budget that makes a phone screenshot thousands of image tokens is warned about at load, with
    the count and the setting; one within reason is only logged (the quick start stays quiet)."""
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.vision.preprocess import VisionBudget, image_processor
    from edge_runtime.generation.vision.settings import VisionSettings
    from edge_runtime.vlm_zoo import write_vlm_folder

    folder = write_vlm_folder(tmp_path, "qwen2_vl", seed=2)
    config = json.loads((folder / "config.json").read_text())
    for max_pixels, warned in ((12845056, True), (200704, False)):  # Qwen2-VL's default; ~256 tokens
        budget = VisionBudget(max_pixels=max_pixels)
        tokens = image_processor(folder, config, budget).num_tokens(1080, 2400)
        caplog.clear()
        with caplog.at_level("INFO", logger="edge_runtime.generation.vision.loading"):
            GenerativeModel("agent", folder, threads=1, vision=VisionSettings(budget=budget)).close()
        said = [r for r in caplog.records if f"screenshot is {tokens} image tokens" in r.getMessage()]
        assert len(said) == 1 and (said[0].levelname == "WARNING") == warned
        assert ("lower [vision] max_pixels" in said[0].getMessage()) == warned
        assert (tokens > 2048) == warned  # 3,354 and 230: Qwen2-VL's default and a phone budget
