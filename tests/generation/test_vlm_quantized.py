"""``convert --to onnx --quantize``: the quantized parts load through ``[vision] precision`` and stay close to fp32.

On Qwen2-VL, GLM-4.1V and Qwen3-VL (whose towers add a position table resampled by GridSample, left fp32;
Qwen3-VL's embedding table is quantized under the Pad that widens its rows).

Random weights make the bound honest but loose: int8 and int4 weights move every logit a
little, so the test asks what quantization must keep on any model (vision features with
cosine >= 0.99 to fp32 per image token, and the first greedy tokens equal to the fp32
folder's), not bit equality. The fp32 folder itself is checked against transformers in
``test_vlm_convert``.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from vlm_checkpoints import (VLMSpec, checkpoint, deepstack_sets, model_inputs, sample_image, session, vision_feeds,
                             vlm_root)

pytest.importorskip("torch")
pytest.importorskip("transformers")

QUANTIZED = ("vision_encoder_quantized", "vision_encoder_q4", "decoder_model_merged_quantized",
             "decoder_model_merged_q4", "decoder_model_merged_int8", "embed_tokens_quantized", "embed_tokens_q4")


SPECS = {"qwen2_vl": VLMSpec(family="qwen2_vl"), "glm4v": VLMSpec(family="glm4v", seed=4, image_size=112),
         "qwen3_vl": VLMSpec(family="qwen3_vl", seed=8, image_size=64, vision_depth=3)}


@pytest.fixture(scope="module", params=sorted(SPECS))
def quantized_folder(request, tmp_path_factory) -> Path:
    from edge_runtime.cli import main

    hf = checkpoint(SPECS[request.param], vlm_root(tmp_path_factory))
    out = tmp_path_factory.mktemp("quantized") / request.param
    assert main(["convert", str(hf), "--to", "onnx", "--out", str(out), "--quantize"]) == 0
    return out


def _ops(folder: Path, part: str) -> collections.Counter:
    proto = onnx.load(str(folder / "onnx" / f"{part}.onnx"), load_external_data=False)
    return collections.Counter(n.op_type for n in proto.graph.node)


def test_quantized_parts_are_written_with_their_kernels(quantized_folder: Path) -> None:
    assert all((quantized_folder / "onnx" / f"{part}.onnx").is_file() for part in QUANTIZED)
    for part, kernel in (("vision_encoder_quantized", "MatMulInteger"), ("vision_encoder_q4", "MatMulNBits"),
                         ("decoder_model_merged_quantized", "MatMulInteger"),
                         ("decoder_model_merged_q4", "MatMulNBits"), ("decoder_model_merged_int8", "MatMulNBits")):
        ops = _ops(quantized_folder, part)
        # one MatMul stays fp32: positions -> rotary angles (a per-call int8 scale would round positions)
        assert ops[kernel] > 0 and ops["MatMul"] == 1, (part, ops)
    for part, bits in (("embed_tokens_quantized", 8), ("embed_tokens_q4", 4)):
        graph = onnx.load(str(quantized_folder / "onnx" / f"{part}.onnx"), load_external_data=False).graph
        # Qwen3-VL: its rows widened with zeros for the DeepStack sets after the quantized gather
        pad = ["Pad"] if quantized_folder.name == "qwen3_vl" else []
        assert [n.op_type for n in graph.node] == ["GatherBlockQuantized", *pad], part
        assert {a.name: a.i for a in graph.node[0].attribute}["bits"] == bits
    external = json.loads((quantized_folder / "config.json").read_text())["transformers.js_config"][
        "use_external_data_format"]
    assert {"decoder_model_merged_q4.onnx", "decoder_model_merged_int8.onnx"} <= set(external)
    assert all((quantized_folder / "onnx" / f"{name}_data").is_file() for name in external)


@pytest.mark.parametrize("part,bits", [("embed_tokens_quantized", 8), ("embed_tokens_q4", 4)])
def test_quantized_embedding_rows_are_read_in_numpy_as_onnxruntime_reads_them(quantized_folder: Path, part: str,
                                                                              bits: int) -> None:
    """The engine reads a quantized table itself (no session run per decode step): its rows equal what ONNX
    Runtime's GatherBlockQuantized gives for the same ids, and lie within one block step of the fp32 rows."""
    from edge_runtime.generation.vision.embeddings import PaddedTable, QuantizedTable, TokenEmbedder

    embedder = TokenEmbedder(quantized_folder / "onnx" / f"{part}.onnx", np.float32)
    table = embedder.table.table if isinstance(embedder.table, PaddedTable) else embedder.table  # Qwen3-VL: padded
    assert isinstance(table, QuantizedTable) and embedder.session is None
    ids = np.array([0, 5, 17, 5, embedder.vocab_size - 1], np.int64)
    ours = embedder.embed(ids)
    theirs = session(quantized_folder, part).run(None, {"input_ids": ids[None]})[0][0]
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-7)
    fp32 = session(quantized_folder, "embed_tokens").run(None, {"input_ids": ids[None]})[0][0]
    hidden = table.shape[1]
    assert not ours[:, hidden:].any() and not fp32[:, hidden:].any()
    ours, fp32 = ours[:, :hidden], fp32[:, :hidden]
    step = np.repeat(np.abs(np.asarray(table.scales[ids])), table.block, axis=1)
    assert not np.array_equal(ours, fp32) and np.all(np.abs(ours - fp32) <= step * 1.0001 + 1e-7)


@pytest.mark.parametrize("precision", ["q8", "q4"])
def test_one_precision_names_every_part(quantized_folder: Path, precision: str) -> None:
    """``[vision] precision = "q8"`` (or ``"q4"``), one name for the folder as transformers.js' ``dtype``
    takes it: every part has a file at that precision, and the model generates."""
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.generation.vision.settings import VisionSettings

    model = GenerativeModel(precision, quantized_folder, GenerationSettings(max_seq_len=512), threads=1,
                            vision=VisionSettings(precision=precision))
    try:
        assert model.vlm.precisions == dict.fromkeys(("decoder", "embed_tokens", "vision_encoder"), precision)
        messages = [{"role": "user", "content": [{"type": "image", "image": sample_image(84, 56, seed=5)},
                                                 {"type": "text", "text": "tap the settings button"}]}]
        assert model.generate(messages=messages, max_tokens=4, ignore_eos=True).usage.completion_tokens == 4
    finally:
        model.close()


def test_int8_vision_features_stay_close_to_fp32(quantized_folder: Path) -> None:
    family = quantized_folder.name
    inputs = model_inputs(family, quantized_folder, sample_image(84, 56, seed=3), "tap")
    feeds = vision_feeds(family, inputs)
    full, quantized = (session(quantized_folder, part).run(None, feeds)[0]
                       for part in ("vision_encoder", "vision_encoder_quantized"))
    assert not np.array_equal(full, quantized)  # really another graph
    cosine = (full * quantized).sum(-1) / (np.linalg.norm(full, axis=-1) * np.linalg.norm(quantized, axis=-1))
    assert cosine.min() >= 0.99, cosine


@pytest.mark.parametrize("precision,kernel", [("q4", "MatMulNBits"), ("int8", "MatMulNBits"),
                                              ("quantized", "MatMulInteger")])
def test_decoders_quantized_from_the_checkpoint_equal_the_quantized_fp32_graph(quantized_folder: Path,
                                                                              precision: str, kernel: str,
                                                                              tmp_path: Path) -> None:
    """The converter builds the quantized decoders from the checkpoint, each weight quantized as it is read
    (``QuantizedOnRead``): the same integers and scales as quantizing the written fp32 decoder
    (``quantize_nbits``: ONNX Runtime's quantizer; ``quantize_decoder_per_token``), which holds the whole
    fp32 graph in memory — so the same graph and logits."""
    import shutil

    from vlm_checkpoints import empty_past

    from edge_runtime.vlm_quant import quantize_decoder_per_token, quantize_nbits

    onnx_dir = tmp_path / "onnx"
    onnx_dir.mkdir()
    for name in ("decoder_model_merged.onnx", "decoder_model_merged.onnx_data"):
        shutil.copyfile(quantized_folder / "onnx" / name, onnx_dir / name)
    if precision == "quantized":
        quantize_decoder_per_token(onnx_dir, "reference")
    else:
        quantize_nbits(onnx_dir, "decoder_model_merged", "reference", 4 if precision == "q4" else 8)
    streamed, reference = (onnx.load(str(path)) for path in (quantized_folder / "onnx" /
                                                            f"decoder_model_merged_{precision}.onnx",
                                                            onnx_dir / "reference.onnx"))
    ops = [collections.Counter(n.op_type for n in m.graph.node) for m in (streamed, reference)]
    assert ops[0] == ops[1] and ops[0][kernel] > 0
    integers = [sorted(t.raw_data for t in m.graph.initializer
                       if t.data_type in (onnx.TensorProto.UINT8, onnx.TensorProto.INT8) and len(t.dims) >= 2)
                for m in (streamed, reference)]
    assert integers[0] == integers[1] and integers[0]  # bit-equal quantized weights
    config = json.loads((quantized_folder / "config.json").read_text())
    rng = np.random.default_rng(1)
    width = config["text_config"]["hidden_size"] * (1 + deepstack_sets(quantized_folder.name))
    feeds = {"inputs_embeds": (rng.standard_normal((1, 9, width)) * 0.2).astype(np.float32),
             "attention_mask": np.ones((1, 9), np.int64),
             "position_ids": np.broadcast_to(np.arange(9, dtype=np.int64), (3, 1, 9)).copy(), **empty_past(config, 1)}
    ours = session(quantized_folder, f"decoder_model_merged_{precision}").run(["logits"], feeds)[0]
    theirs = session(tmp_path, "reference").run(["logits"], feeds)[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def qwen_quantized(tmp_path_factory) -> Path:
    from edge_runtime.cli import main

    out = tmp_path_factory.mktemp("quantized-qwen") / "qwen2_vl"
    assert main(["convert", str(checkpoint(SPECS["qwen2_vl"], vlm_root(tmp_path_factory))), "--to", "onnx", "--out",
                 str(out), "--quantize"]) == 0
    return out


@pytest.mark.parametrize("decoder,min_corr,median_corr", [("q8", 0.99, 0.995), ("int8", 0.99, 0.995),
                                                          ("q4", 0.5, 0.85)])
def test_quantized_decoders_keep_fp32_logits_at_every_position(quantized_folder: Path, decoder: str,
                                                               min_corr: float, median_corr: float) -> None:
    """Each quantized decoder's logits over a 40-token prompt correlate with fp32's position by position
    (random weights: measured q8/int8 >= 0.994 and q4 median 0.91, min 0.70, on both families; a wrong
    scale or a weight quantized in the wrong order would fall far below). Greedy tokens of a random
    model often sit on margins of a tenth of a logit, so their equality is luck beyond the first."""
    from vlm_checkpoints import empty_past

    config = json.loads((quantized_folder / "config.json").read_text())
    ids = np.random.default_rng(0).integers(0, 500, (1, 40))
    embeds = session(quantized_folder, "embed_tokens").run(None, {"input_ids": ids})[0]
    positions = np.broadcast_to(np.arange(40, dtype=np.int64), (3, 1, 40)).copy()
    feeds = {"inputs_embeds": embeds, "attention_mask": np.ones((1, 40), np.int64), "position_ids": positions,
             **empty_past(config, 1)}
    part = {"q8": "decoder_model_merged_quantized", "int8": "decoder_model_merged_int8",
            "q4": "decoder_model_merged_q4"}[decoder]
    full, quantized = (session(quantized_folder, name).run(["logits"], feeds)[0][0]
                       for name in ("decoder_model_merged", part))
    assert not np.array_equal(full, quantized)
    corr = np.array([np.corrcoef(a, b)[0, 1] for a, b in zip(full, quantized)])
    assert corr.min() >= min_corr and np.median(corr) >= median_corr, corr


@pytest.mark.parametrize("decoder", ["q8", "q4", "int8"])
def test_quantized_decoders_load_by_precision_and_keep_the_first_greedy_tokens(qwen_quantized: Path,
                                                                               decoder: str) -> None:
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.generation.vision.settings import VisionSettings

    messages = [{"role": "user", "content": [{"type": "image", "image": sample_image(84, 56, seed=5)},
                                             {"type": "text", "text": "tap the settings button"}]}]
    tokens = {}
    for name, precision in (("fp32", {}), ("quantized", {"decoder": decoder, "vision_encoder": "q8"})):
        model = GenerativeModel(name, qwen_quantized, GenerationSettings(max_seq_len=512), threads=1,
                                vision=VisionSettings(precision=precision))
        try:
            if precision:
                assert model.vlm.precisions["decoder"] == decoder
            tokens[name] = list(model.generate(messages=messages, max_tokens=4, ignore_eos=True).token_ids)
        finally:
            model.close()
    assert tokens["quantized"][:2] == tokens["fp32"][:2], tokens


def _alone_and_together(model) -> tuple[list[list[int]], list[list[int]]]:
    """24 tokens of three requests (one with an image) one at a time, and the same three at once."""
    import concurrent.futures

    requests = [[{"role": "user", "content": [{"type": "image", "image": sample_image(84, 56, seed=5)},
                                              {"type": "text", "text": "tap the settings button"}]}],
                [{"role": "user", "content": "scroll down to the network entry and open it " * 3}],
                [{"role": "user", "content": "go back"}]]
    alone = [list(model.generate(messages=m, max_tokens=24, ignore_eos=True).token_ids) for m in requests]
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda m: list(model.generate(messages=m, max_tokens=24,
                                                               ignore_eos=True).token_ids), requests))
    return alone, together


def test_the_q8_decoder_answers_a_request_alike_alone_and_beside_another(quantized_folder: Path) -> None:
    """Per-token activation scales: a row's rounding does not depend on the other rows of a decode step
    (a per-call scale, onnxruntime's quantize_dynamic, made the same request answer otherwise in a batch)."""
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.generation.vision.settings import VisionSettings

    model = GenerativeModel("q8", quantized_folder, GenerationSettings(max_seq_len=512, prefix_cache_bytes=0),
                            threads=1, vision=VisionSettings(precision={"decoder": "q8", "vision_encoder": "q8"}))
    try:
        alone, together = _alone_and_together(model)
    finally:
        model.close()
    assert together == alone, (together, alone)


def test_a_per_call_scaled_q8_decoder_is_served_per_token(quantized_folder: Path, tmp_path: Path) -> None:
    """An onnx-community q8 decoder as transformers.js writes it (onnxruntime's quantize_dynamic: one
    activation scale per call) is served with the same integers and per-token activation scales
    (``per_token_exports``): a request answers alike alone and beside others; ``fuse_exports = false``
    serves the file as it is."""
    import shutil

    from onnxruntime.quantization import QuantType, quantize_dynamic

    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.generation.vision.settings import VisionSettings

    folder = tmp_path / quantized_folder.name
    shutil.copytree(quantized_folder, folder)
    exported = folder / "onnx" / "decoder_model_merged_quantized.onnx"
    for stale in folder.glob("onnx/decoder_model_merged_quantized.onnx*"):
        stale.unlink()
    quantize_dynamic(folder / "onnx" / "decoder_model_merged.onnx", exported, weight_type=QuantType.QInt8,
                     extra_options={"MatMulConstBOnly": True,  # contrib ops stop its shape inference:
                                    "DefaultTensorType": onnx.TensorProto.FLOAT})
    vision = VisionSettings(precision={"decoder": "q8"})
    plain = GenerativeModel("as-exported", folder, GenerationSettings(max_seq_len=512, fuse_exports=False),
                            threads=1, vision=vision, cache_dir=tmp_path / "cache")
    try:
        assert plain.folder.model_path == exported
    finally:
        plain.close()
    model = GenerativeModel("q8", folder, GenerationSettings(max_seq_len=512, prefix_cache_bytes=0), threads=1,
                            vision=vision, cache_dir=tmp_path / "cache")
    try:
        served = onnx.load(str(model.folder.model_path), load_external_data=False)
        ops = collections.Counter(n.op_type for n in served.graph.node)
        original = collections.Counter(n.op_type for n in onnx.load(str(exported)).graph.node)
        assert model.folder.model_path.is_relative_to(tmp_path / "cache")
        assert ops["DynamicQuantizeLinear"] == 0 and ops["MatMulInteger"] == original["MatMulInteger"] > 0
        alone, together = _alone_and_together(model)
    finally:
        model.close()
    assert together == alone, (together, alone)
