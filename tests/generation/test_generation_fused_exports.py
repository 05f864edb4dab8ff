"""An optimum export rebuilt as the fused graph at load (``generation.fused_exports``, ``decoder_from_export``).

Oracles: the export itself (its no-cache recompute and its logits, run by ONNX Runtime unchanged)
and the export served as exported (``fuse_exports`` off).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from generation_fixtures import oracle_greedy

MESSAGES = [{"role": "system", "content": "You are a phone agent."},
            {"role": "user", "content": "open the settings menu then scroll down"}]


def _model(folder: Path, cache: Path, **settings):
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings

    return GenerativeModel(folder.name, folder, GenerationSettings(**settings), threads=1, cache_dir=cache)


def _decodes_alike_alone_and_batched(model) -> None:
    """Three prompts give the same 16 greedy tokens one at a time and as three rows of one continuous batch."""
    prompts = [model.prepare(messages=MESSAGES).ids, model.prepare(messages=MESSAGES[1:]).ids, [7, 8, 9]]
    alone = [list(model.generate(prompt=ids, max_tokens=16).token_ids) for ids in prompts]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        together = list(pool.map(lambda ids: list(model.generate(prompt=ids, max_tokens=16).token_ids), prompts))
    assert together == alone


def _copy(export: Path, where: Path) -> Path:
    shutil.copytree(export, where)
    return where


def test_an_export_runs_as_the_fused_graph_with_the_exports_tokens(onnx_folder: Path, tmp_path: Path) -> None:
    from edge_runtime.generation.fused_exports import CACHE_SUBDIR

    model = _model(onnx_folder, tmp_path, max_batch_size=3, prefill_chunk_tokens=5, idle_prefill_chunk_tokens=0)
    plain = _model(onnx_folder, tmp_path, max_batch_size=3, fuse_exports=False)
    try:
        assert model.folder.kv_in_place and model.folder.keeps_logits and not plain.folder.kv_in_place
        assert model.folder.model_path.is_relative_to(tmp_path / CACHE_SUBDIR)
        assert model.folder.path == onnx_folder and model.folder.weight_files == plain.folder.weight_files
        assert model.kv_cache_bytes * 2 == plain.kv_cache_bytes  # one buffer per layer tensor, appended in place
        eos = set(model.folder.eos_token_ids)
        prompts = [model.prepare(messages=MESSAGES).ids, model.prepare(messages=MESSAGES[1:]).ids, [7, 8, 9]]
        expected = [oracle_greedy(onnx_folder, ids, 20, eos) for ids in prompts]  # the export, no cache
        with concurrent.futures.ThreadPoolExecutor(3) as pool:  # three rows of one continuous batch
            together = list(pool.map(lambda ids: list(model.generate(prompt=ids, max_tokens=20).token_ids), prompts))
        assert together == expected
        assert [list(plain.generate(prompt=ids, max_tokens=20).token_ids) for ids in prompts] == expected
    finally:
        model.close()
        plain.close()


def test_the_rebuilt_graph_computes_the_exports_logits(onnx_folder: Path, tmp_path: Path) -> None:
    """Through a chunked prefill and decode steps, every position's logits, against the export's."""
    import onnxruntime as ort

    from edge_runtime.generation.folder import read_folder
    from edge_runtime.generation.fused_exports import fused_export

    export = read_folder(onnx_folder)
    fused, why = fused_export(export, True, tmp_path)
    assert fused.model_path != export.model_path, why
    sessions = [ort.InferenceSession(str(d.model_path), providers=["CPUExecutionProvider"]) for d in (export, fused)]
    ids = np.random.default_rng(5).integers(0, export.vocab_size, 19)
    results = []
    for session in sessions:
        past = {i.name: np.zeros((1, export.kv.kv_heads, 0, export.kv.head_dim), np.float32)
                for i in session.get_inputs() if i.name.startswith("past_key_values.")}
        logits, start = [], 0
        for chunk in (6, 7, 1, 1, 1, 1, 1, 1):  # two prefill chunks, then one token at a time
            piece = ids[start:start + chunk][None]
            feeds = {"input_ids": piece, "attention_mask": np.ones((1, start + chunk), np.int64),
                     "position_ids": np.arange(start, start + chunk)[None], **past}
            outputs = session.run(None, feeds)
            names = [o.name for o in session.get_outputs()]
            logits.append(outputs[names.index("logits")][0])
            past = {n.replace("present.", "past_key_values."): v for n, v in zip(names, outputs) if n != "logits"}
            start += chunk
        results.append(np.concatenate(logits))
    scale = np.abs(results[0]).max()
    np.testing.assert_allclose(results[1], results[0], atol=1e-4 * scale, rtol=0)


def test_the_rebuild_is_cached_and_follows_the_export(onnx_folder: Path, tmp_path: Path, monkeypatch) -> None:
    import edge_runtime.decoder_from_export as rebuild
    from edge_runtime.generation.folder import read_folder
    from edge_runtime.generation.fused_exports import DONE, fused_export

    folder = _copy(onnx_folder, tmp_path / "export")
    first, _ = fused_export(read_folder(folder), True, tmp_path / "cache")
    assert json.loads((first.model_path.parent / DONE).read_text())["logit_difference"] < 1e-3

    def refuse(*_):
        raise AssertionError("rebuilt again")

    monkeypatch.setattr(rebuild, "fused_from_export", refuse)
    again, why = fused_export(read_folder(folder), True, tmp_path / "cache")
    assert again.model_path == first.model_path, why
    # a changed export (its config here) gets its own rebuild
    monkeypatch.undo()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    changed, _ = fused_export(read_folder(folder), True, tmp_path / "cache")
    assert changed.model_path != first.model_path and changed.kv_in_place
    assert not first.model_path.exists()  # the earlier rebuild of the same export is gone
    other, _ = fused_export(read_folder(onnx_folder), True, tmp_path / "cache")  # another export's stays
    assert other.model_path.exists() and changed.model_path.exists()


def test_exports_it_cannot_rebuild_are_served_as_exported_with_the_reason(onnx_folder: Path, tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from edge_runtime.generation.folder import read_folder
    from edge_runtime.generation.fused_exports import fused_export

    cases = {}
    scaled = _copy(onnx_folder, tmp_path / "scaled")
    config = json.loads((scaled / "config.json").read_text())
    (scaled / "config.json").write_text(json.dumps({**config, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}}))
    cases[scaled] = "rope_scaling"
    other = _copy(onnx_folder, tmp_path / "other")
    (other / "config.json").write_text(json.dumps({**config, "model_type": "phi3"}))
    cases[other] = "model_type 'phi3'"
    integer = _copy(onnx_folder, tmp_path / "int32")  # MatMulInteger's weights as something else than 8 bits
    quantize_dynamic(onnx_folder / "model.onnx", integer / "model.onnx", weight_type=QuantType.QInt8,
                     extra_options={"MatMulConstBOnly": True})
    graph = onnx.load(str(integer / "model.onnx"))
    weight = next(t for t in graph.graph.initializer if t.name.endswith("_quantized") and len(t.dims) == 2
                  and any(n.op_type == "MatMulInteger" and n.input[1] == t.name for n in graph.graph.node))
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight).astype(np.int32), weight.name))
    onnx.save(graph, str(integer / "model.onnx"))
    cases[integer] = "INT32 weights"
    for folder, reason in cases.items():
        export = read_folder(folder)
        served, why = fused_export(export, True, tmp_path / "cache")
        assert reason in why and not served.kv_in_place
        # the fp32 ones as they are; the int8 one's other MatMulIntegers go per token (per_token_exports)
        assert (served == export) == (folder != integer)
        assert fused_export(export, True, tmp_path / "cache") == (served, why)  # the refusal is kept
    export = read_folder(onnx_folder)
    assert fused_export(export, False, tmp_path / "cache") == (export, "[generation] fuse_exports is off")


@pytest.mark.parametrize("level,symmetric", [(0, True), (4, False)])
def test_an_int4_export_is_rebuilt_with_its_own_quantized_weights(onnx_folder: Path, tmp_path: Path,
                                                                  level: int, symmetric: bool) -> None:
    """An export quantized by onnxruntime's MatMulNBitsQuantizer (transformers.js' model_q4.onnx) keeps its
    quantized weights (and zero points), packed per input; tokens equal the quantized export's own
    no-cache recompute."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from edge_runtime.generation.folder import read_folder
    from edge_runtime.generation.fused_exports import fused_export

    folder = _copy(onnx_folder, tmp_path / "q4")
    quantizer = MatMulNBitsQuantizer(onnx.load(str(folder / "model.onnx")), bits=4, block_size=32,
                                     is_symmetric=symmetric, accuracy_level=level)
    quantizer.process()
    quantized = quantizer.model.model
    assert any(len(n.input) > 3 for n in quantized.graph.node if n.op_type == "MatMulNBits") != symmetric
    onnx.save(quantized, str(folder / "model.onnx"))
    export = read_folder(folder)
    served, why = fused_export(export, True, tmp_path / "cache")
    assert served.kv_in_place, why
    graph = onnx.load(str(served.model_path))
    counts = {op: sum(n.op_type == op for n in graph.graph.node) for op in ("MatMulNBits", "MatMul")}
    layers = export.kv.layers
    untied = any(n.name.startswith("/lm_head/") and n.op_type == "MatMulNBits" for n in quantized.graph.node)
    assert counts["MatMulNBits"] == 4 * layers + untied  # packed qkv, o, gate+up, down (+ an untied head)
    assert {a.i for n in graph.graph.node if n.op_type == "MatMulNBits" for a in n.attribute
            if a.name == "accuracy_level"} == {level}
    model = _model(folder, tmp_path / "cache", max_batch_size=2)
    try:
        ids = model.prepare(messages=MESSAGES).ids
        eos = set(model.folder.eos_token_ids)
        assert list(model.generate(prompt=ids, max_tokens=16).token_ids) == oracle_greedy(folder, ids, 16, eos)
    finally:
        model.close()


def _integer_columns(proto, scale_of, vocab: int) -> list[tuple[bytes, float, int]]:
    """Every column of every MatMulInteger weight of ``proto`` but the LM head's (``vocab`` columns) with its
    scale and zero point, sorted: ``scale_of(node)`` names the scale initializer (per tensor or per
    column) of that node's weight."""
    from onnx import numpy_helper

    arrays = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    columns = []
    for node in proto.graph.node:
        if node.op_type == "MatMulInteger" and arrays[node.input[1]].shape[1] != vocab:
            q = arrays[node.input[1]]
            scale = np.broadcast_to(arrays[scale_of(node)].reshape(-1), (q.shape[1],))
            zero = arrays[node.input[3]] if len(node.input) > 3 and node.input[3] else np.zeros(1, q.dtype)
            zero = np.broadcast_to(zero.reshape(-1), (q.shape[1],))
            columns += [(q[:, n].tobytes(), float(scale[n]), int(zero[n])) for n in range(q.shape[1])]
    return sorted(columns)


@pytest.mark.parametrize("weights", ["int8", "int8-per-channel", "uint8"])
def test_a_dynamic_int8_export_is_rebuilt_with_its_own_integers(onnx_folder: Path, tmp_path: Path,
                                                                weights: str) -> None:
    """onnxruntime's quantize_dynamic as transformers.js runs it for a decoder (model_quantized.onnx: int8
    weights, MatMulConstBOnly; per tensor by default, per channel as its option; model_uint8.onnx: uint8
    weights with zero points): rebuilt as the fused graph whose MatMulIntegers hold the export's
    integers, scales and zero points, column for column, its embedding table still 8-bit; a row decodes the same alone and in a continuous batch (the export's per-tensor
    activation scale is shared by the rows of a step); and with activations rounded per token rather
    than per tensor, its logits are closer to the fp32 model the export was quantized from than the
    export's own (same weights: the difference is the activations' rounding)."""
    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from edge_runtime.generation.folder import read_folder
    from edge_runtime.generation.fused_exports import fused_export

    folder = _copy(onnx_folder, tmp_path / "q8")
    quantize_dynamic(onnx_folder / "model.onnx", folder / "model.onnx",
                     weight_type=QuantType.QUInt8 if weights == "uint8" else QuantType.QInt8,
                     per_channel=weights.endswith("per-channel"),
                     extra_options={"MatMulConstBOnly": True, "EnableSubgraph": True})
    export = read_folder(folder)
    served, why = fused_export(export, True, tmp_path / "cache")
    assert served.kv_in_place and why.startswith("rebuilt"), why
    exported, rebuilt = onnx.load(str(folder / "model.onnx")), onnx.load(str(served.model_path))
    # packed qkv, o, gate+up, down a layer, and the head: the export's own MatMulInteger where it is
    # untied, else the embedding's uint8 table (the export's head dequantizes it for a float MatMul)
    assert sum(n.op_type == "MatMulInteger" for n in rebuilt.graph.node) == 4 * export.kv.layers + 1
    # quantize_dynamic names a weight's scale after it; per_token_int8 multiplies it in the node ".columns"
    ours = {n.name: n for n in rebuilt.graph.node}
    vocab = export.vocab_size
    assert _integer_columns(rebuilt, lambda n: ours[n.name.removesuffix(".int8") + ".columns"].input[1], vocab) \
        == _integer_columns(exported, lambda n: n.input[1].removesuffix("_quantized") + "_scale", vocab)
    arrays = {t.name: numpy_helper.to_array(t) for graph in (rebuilt, exported) for t in graph.graph.initializer}
    head = next(arrays[n.input[1]] for n in rebuilt.graph.node
                if n.op_type == "MatMulInteger" and arrays[n.input[1]].shape[1] == vocab)
    untied = next((arrays[n.input[1]] for n in exported.graph.node
                   if n.op_type == "MatMulInteger" and n.name.startswith("/lm_head/")), None)
    np.testing.assert_array_equal(head, untied if untied is not None else
                                  arrays["model.embed_tokens.weight_quantized"].T)
    hidden = json.loads((folder / "config.json").read_text())["hidden_size"]
    assert any(t.data_type == onnx.TensorProto.UINT8 and list(t.dims) == [export.vocab_size, hidden]
               for t in rebuilt.graph.initializer)  # the embedding table, as in the export
    model = _model(folder, tmp_path / "cache", max_batch_size=3)
    try:
        _decodes_alike_alone_and_batched(model)
    finally:
        model.close()
    rng, error = np.random.default_rng(1), {"export": [], "rebuilt": []}
    for _ in range(8):
        tokens = [int(t) for t in rng.integers(3, export.vocab_size, 24)]
        fp32 = _last_logits(onnx_folder / "model.onnx", export.kv, tokens)
        for side, path in (("export", folder / "model.onnx"), ("rebuilt", served.model_path)):
            error[side].append(np.abs(_last_logits(path, export.kv, tokens) - fp32).max() / np.abs(fp32).max())
    assert np.mean(error["rebuilt"]) < np.mean(error["export"]), error


def _last_logits(path: Path, layout, tokens: list[int]) -> np.ndarray:
    """The last position's logits of the decoder graph ``path`` for ``tokens`` from an empty cache."""
    import onnxruntime as ort

    from edge_runtime.generation.engine import kv_names

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    n = len(tokens)
    feeds = {"input_ids": np.array([tokens], np.int64), "attention_mask": np.ones((1, n), np.int64),
             "position_ids": np.arange(n, dtype=np.int64)[None]}
    feeds.update({name: np.zeros((1, layout.kv_heads, 0, layout.head_dim), np.float32)
                  for name in kv_names(layout.layers)[0]})
    accepted = {i.name for i in session.get_inputs()}
    return session.run(["logits"], {k: v for k, v in feeds.items() if k in accepted})[0][0, -1]


def test_the_logit_check_refuses_a_rebuild_that_misread_the_export(qwen_folder: Path, tmp_path: Path) -> None:
    """Biases the exporter named otherwise are not found by name: the rebuilt graph then lacks them, and
    the logit check (not the name reading) is what keeps the export."""
    import onnx

    from edge_runtime.generation.folder import read_folder
    from edge_runtime.generation.fused_exports import fused_export

    folder = _copy(qwen_folder, tmp_path / "renamed")
    proto = onnx.load(str(folder / "model.onnx"))
    renamed = {}
    for tensor in proto.graph.initializer:
        if tensor.name.startswith("model.layers.0.self_attn.") and tensor.name.endswith("_proj.bias"):
            renamed[tensor.name] = tensor.name.replace("model.layers.0.", "exporter_")
            tensor.name = renamed[tensor.name]
    assert len(renamed) == 3  # Qwen2's q, k and v biases
    for node in proto.graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
    onnx.save(proto, str(folder / "model.onnx"))
    export = read_folder(folder)
    served, why = fused_export(export, True, tmp_path / "cache")
    assert served == export and "logits differ" in why


def test_the_budget_plans_what_the_load_takes(onnx_folder: Path, tmp_path: Path) -> None:
    from edge_runtime.generation.footprint import loaded_footprint, planned_footprint
    from edge_runtime.generation.settings import GenerationSettings

    settings = GenerationSettings(max_batch_size=2, max_seq_len=128)
    planned = planned_footprint(onnx_folder, settings, 1.0, cache_dir=tmp_path)  # rebuilds into the cache
    model = _model(onnx_folder, tmp_path, max_batch_size=2, max_seq_len=128)
    try:
        assert model.folder.kv_in_place
        assert planned == loaded_footprint(model, 1.0)
    finally:
        model.close()


def test_the_default_runtime_serves_an_export_fused(onnx_folder: Path, tmp_path: Path) -> None:
    """The default configuration (``Runtime()``, its cache) loads an export as the fused graph."""
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    runtime = Runtime(RuntimeConfig(cache_dir=tmp_path))
    model = runtime.load_generative(onnx_folder)
    try:
        assert model.folder.kv_in_place and model.folder.model_path.is_relative_to(tmp_path)
        ids = model.prepare(messages=MESSAGES).ids
        assert list(model.generate(prompt=ids, max_tokens=12).token_ids) == oracle_greedy(
            onnx_folder, ids, 12, set(model.folder.eos_token_ids))
    finally:
        model.close()
        runtime.close()


def test_quantizing_an_export_quantizes_its_fused_rebuild(qwen_folder: Path, tmp_path: Path) -> None:
    """``quantize`` on an export writes the fused graph quantized: the same graph, bit for bit in its
    logits, as quantizing our builder's graph of the checkpoint the export came from."""
    import onnx
    import onnxruntime as ort

    from edge_runtime.decoder_zoo import decoder_folder_from_hf
    from edge_runtime.generation.folder import read_folder
    from edge_runtime.optimize.decoder_quant import quantize_decoder
    from generation_fixtures import SPECS, models_root
    from hf_decoders import hf_folder

    built = decoder_folder_from_hf(hf_folder(SPECS["qwen2"], models_root()), tmp_path / "built")
    outs = []
    for source, name in ((qwen_folder, "from-export"), (built, "from-checkpoint")):
        quantize_decoder(source, tmp_path / name, "int4", kernel="matmulnbits", accuracy_level=4,
                         cache_dir=tmp_path / "cache")
        outs.append(tmp_path / name)
    ops = {n.op_type for n in onnx.load(str(outs[0] / "model.onnx")).graph.node}
    assert {"GroupQueryAttention", "MatMulNBits"} <= ops and read_folder(outs[0]).kv_in_place
    ids = np.arange(3, 40)[None]
    logits = []
    for out in outs:
        d = read_folder(out)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(ids.shape[1])[None]}
        feeds.update({f"past_key_values.{i}.{k}": np.zeros((1, d.kv.kv_heads, 0, d.kv.head_dim), np.float32)
                      for i in range(d.kv.layers) for k in ("key", "value")})
        logits.append(ort.InferenceSession(str(d.model_path), providers=["CPUExecutionProvider"])
                      .run(["logits"], feeds)[0])
    np.testing.assert_array_equal(logits[0], logits[1])


@pytest.fixture(scope="module")
def community_folder(qwen_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The export in the onnx-community / transformers.js layout: configs and tokenizer at the top, the
    graph under ``onnx/`` in fp32 (weights in ``model.onnx_data``) and as MatMulNBits int4 (``model_q4.onnx``)."""
    import onnx

    from edge_runtime.optimize.decoder_quant import matmul_nbits

    folder = tmp_path_factory.mktemp("community") / "qwen2"
    (folder / "onnx").mkdir(parents=True)
    for item in qwen_folder.iterdir():
        if item.name != "model.onnx":
            shutil.copy2(item, folder / item.name)
    # fp32 with its weights in model.onnx_data, as onnx-community ships it (the rebuild reads them from there)
    onnx.save(onnx.load(str(qwen_folder / "model.onnx")), str(folder / "onnx" / "model.onnx"),
              save_as_external_data=True, location="model.onnx_data", size_threshold=0)
    onnx.save(matmul_nbits(onnx.load(str(qwen_folder / "model.onnx")), 4, 32, 4), str(folder / "onnx" / "model_q4.onnx"))
    return folder


def test_the_onnx_community_layout_loads_each_precision(community_folder: Path, tmp_path: Path) -> None:
    from edge_runtime.errors import ModelLoadError
    from edge_runtime.generation.folder import is_generative_folder

    assert is_generative_folder(community_folder)
    ids = [3, 17, 99, 250, 12, 7, 41]
    for precision, rebuilt in (("", True), ("fp32", True), ("q4", True)):
        model = _model(community_folder, tmp_path, precision=precision)
        try:
            expected_file = "model_q4.onnx" if precision == "q4" else "model.onnx"
            assert model.folder.kv_in_place == rebuilt  # int4 too: MatMulNBits kept, attention fused
            assert model.folder.weight_files[0] == community_folder / "onnx" / expected_file
            eos = set(model.folder.eos_token_ids)
            assert list(model.generate(prompt=ids, max_tokens=16).token_ids) == oracle_greedy(
                community_folder, ids, 16, eos, precision)
        finally:
            model.close()
    with pytest.raises(ModelLoadError, match=r"precision 'fp16' has no onnx/ file here; present: \['fp32', 'q4'\]"):
        _model(community_folder, tmp_path, precision="fp16")
    from edge_runtime.generation.folder import decoder_file

    both = tmp_path / "both"  # an optimum model.onnx beside an onnx/ folder: the top file is fp32's
    shutil.copytree(community_folder, both)
    shutil.copy2(community_folder / "onnx" / "model_q4.onnx", both / "model.onnx")
    assert decoder_file(both) == decoder_file(both, "fp32") == both / "model.onnx"
    assert decoder_file(both, "q4") == both / "onnx" / "model_q4.onnx"
    with pytest.raises(ModelLoadError, match="names a file of the onnx/ layout; this folder has only model.onnx"):
        decoder_file(_only_top(community_folder, tmp_path / "top"), "q4")


def _only_top(community: Path, where: Path) -> Path:
    where.mkdir()
    for item in community.iterdir():
        if item.is_file():
            shutil.copy2(item, where / item.name)
    shutil.copy2(community / "onnx" / "model_q4.onnx", where / "model.onnx")
    return where


def test_a_bad_precision_setting_is_a_config_error() -> None:
    from edge_runtime.errors import ConfigError
    from edge_runtime.generation.settings import GenerationSettings

    with pytest.raises(ConfigError, match=r"\[generation\] precision must be one of .*'q4'.*got 'int3'"):
        GenerationSettings(precision="int3")


def test_a_llama3_scaled_rope_export_is_rebuilt_with_its_scaling(tmp_path: Path) -> None:
    """Llama 3's rope scaling (long wavelengths slowed, short kept, the band between blended): the rebuild's
    rotary tables follow it, so tokens past the original context equal the export's no-cache recompute."""
    from generation_fixtures import SPECS, models_root
    from hf_decoders import optimum_folder

    from edge_runtime.decoder_zoo import decoder_folder_from_hf
    from hf_decoders import hf_folder

    spec = dataclasses.replace(SPECS["llama"], llama3_rope=(8.0, 1.0, 4.0, 32), seed=7)
    export = optimum_folder(spec, models_root())
    assert json.loads((export / "config.json").read_text())["rope_scaling"]["rope_type"] == "llama3"
    ids = [int(t) for t in np.random.default_rng(2).integers(3, 500, 90)]  # past the original 32 positions
    # the export rebuilt at load, and our builder's graph of the checkpoint it came from (fused and plain)
    built = [decoder_folder_from_hf(hf_folder(spec, models_root()), tmp_path / f"built-{fused}", fused=fused)
             for fused in (True, False)]
    for folder in (export, *built):
        model = _model(folder, tmp_path, max_batch_size=2)
        try:
            assert model.folder.kv_in_place == (folder != built[1])
            eos = set(model.folder.eos_token_ids)
            assert list(model.generate(prompt=ids, max_tokens=24).token_ids) == oracle_greedy(export, ids, 24, eos)
        finally:
            model.close()


def test_a_qwen3_export_is_rebuilt_with_its_head_size_and_qk_norms(tmp_path: Path) -> None:
    """Qwen3: head_dim 32 with hidden 64 over 4 heads (not hidden / heads), an RMSNorm over each query and
    key head; the export rebuilt, and our builder's graphs of its checkpoint (fused and plain), decode the
    export's no-cache tokens and transformers' own."""
    import torch
    import transformers

    from edge_runtime.decoder_zoo import decoder_folder_from_hf
    from generation_fixtures import models_root
    from hf_decoders import DecoderSpec, hf_folder, optimum_folder

    spec = DecoderSpec(arch="qwen3", hidden=64, layers=2, heads=4, kv_heads=2, vocab=512, max_positions=256,
                       head_dim=32, seed=11)
    export = optimum_folder(spec, models_root())
    hf = hf_folder(spec, models_root())
    ids = [int(t) for t in np.random.default_rng(4).integers(3, 500, 40)]
    with torch.no_grad():
        model = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    expected = out[0, len(ids):].tolist()
    assert expected == oracle_greedy(export, ids, 20, set())  # the export is the checkpoint's
    built = [decoder_folder_from_hf(hf, tmp_path / f"built-{fused}", fused=fused) for fused in (True, False)]
    for folder in (export, *built):
        served = _model(folder, tmp_path, max_batch_size=2)
        try:
            assert served.folder.kv_in_place == (folder != built[1])
            assert list(served.generate(prompt=ids, max_tokens=20, ignore_eos=True).token_ids) == expected
        finally:
            served.close()


def test_a_rebuild_that_fails_serves_the_export_and_is_tried_again(qwen_folder: Path, tmp_path: Path,
                                                                   monkeypatch) -> None:
    import edge_runtime.decoder_from_export as rebuild
    from edge_runtime.generation.folder import read_folder
    from edge_runtime.generation.fused_exports import fused_export

    export = read_folder(qwen_folder)
    real = rebuild.fused_from_export

    def broken(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rebuild, "fused_from_export", broken)
    served, why = fused_export(export, True, tmp_path / "cache")
    assert served == export and "rebuild failed (OSError" in why and "No space left" in why
    monkeypatch.setattr(rebuild, "fused_from_export", real)
    served, why = fused_export(export, True, tmp_path / "cache")  # nothing was kept: built now
    assert served.kv_in_place, why


def test_an_export_without_position_ids_is_rebuilt_and_batches(qwen_folder: Path, tmp_path: Path) -> None:
    """Older exports derive positions inside (no ``position_ids`` input: the engine decodes them one
    sequence at a time); the rebuild takes ``position_ids`` and batches, with the export's tokens."""
    import onnx
    from onnx import TensorProto, helper

    folder = _copy(qwen_folder, tmp_path / "no-positions")
    proto = onnx.load(str(folder / "model.onnx"))
    # positions past .. total - 1 from the two inputs' widths, in place of the input
    made = [helper.make_node("Shape", ["attention_mask"], ["np.total_shape"], start=1, end=2),
            helper.make_node("Shape", ["input_ids"], ["np.seq_shape"], start=1, end=2),
            helper.make_node("Sub", ["np.total_shape", "np.seq_shape"], ["np.past_shape"]),
            helper.make_node("Squeeze", ["np.past_shape"], ["np.past"]),
            helper.make_node("Squeeze", ["np.total_shape"], ["np.total"]),
            helper.make_node("Constant", [], ["np.one"], value=helper.make_tensor("one", TensorProto.INT64, [], [1])),
            helper.make_node("Range", ["np.past", "np.total", "np.one"], ["np.range"]),
            helper.make_node("Constant", [], ["np.axes"], value=helper.make_tensor("a", TensorProto.INT64, [1], [0])),
            helper.make_node("Unsqueeze", ["np.range", "np.axes"], ["position_ids"])]
    nodes = list(proto.graph.node)
    del proto.graph.node[:]
    proto.graph.node.extend(made + nodes)
    kept = [i for i in proto.graph.input if i.name != "position_ids"]
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    onnx.save(proto, str(folder / "model.onnx"))
    model = _model(folder, tmp_path / "cache", max_batch_size=2)
    try:
        assert model.folder.kv_in_place and model.folder.has_position_ids
        prompts = [[5, 9, 31, 77, 102, 3], [44, 12, 8]]
        expected = [oracle_greedy(folder, ids, 12, set(model.folder.eos_token_ids)) for ids in prompts]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            assert list(pool.map(lambda ids: list(model.generate(prompt=ids, max_tokens=12).token_ids),
                                 prompts)) == expected
    finally:
        model.close()


def test_a_served_onnx_community_folder_takes_its_precision_from_config_toml(community_folder: Path,
                                                                             tmp_path: Path) -> None:
    """Over HTTP: ``[generation] precision = "q4"`` serves ``onnx/model_q4.onnx`` rebuilt (the openai
    client's answer equals the embedded model's on that file); a precision the folder lacks leaves the
    model unavailable with the reason, and the other model serves."""
    import urllib.request

    import openai

    from edge_runtime.server.state import STATE
    from generation_fixtures import base_url, make_model, served_repository

    root = tmp_path / "repository"
    for name, precision in (("agent", "q4"), ("missing", "fp16")):
        shutil.copytree(community_folder, root / name / "1")
        (root / name / "config.toml").write_text(f'[generation]\nprecision = "{precision}"\n')
    embedded = make_model(community_folder, precision="q4")
    try:
        expected = embedded.generate(messages=MESSAGES, max_tokens=12).text
    finally:
        embedded.close()
    with served_repository(root, tmp_path / "cache") as live:
        served = live.app[STATE].repository.get("agent").model
        assert served.folder.kv_in_place and served.folder.weight_files[0].name == "model_q4.onnx"
        client = openai.OpenAI(base_url=base_url(live) + "/v1", api_key="unused", max_retries=0, timeout=60)
        answer = client.chat.completions.create(model="agent", messages=MESSAGES, max_tokens=12, temperature=0)
        assert answer.choices[0].message.content == expected
        request = urllib.request.Request(base_url(live) + "/v2/repository/index", data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            entries = {e["name"]: e for e in json.loads(response.read())}
    assert entries["agent"]["state"] == "READY"
    assert entries["missing"]["state"] == "UNAVAILABLE"
    assert "precision 'fp16' has no onnx/ file here" in entries["missing"]["reason"]


def test_an_int8_export_it_cannot_rebuild_is_served_per_token(onnx_folder: Path, tmp_path: Path) -> None:
    """A q8 export of a family the rebuild does not know keeps its graph, but its per-call
    DynamicQuantizeLinear scales become per-token ones on the same integers (``per_token_exports``):
    three requests decode alike alone and in one continuous batch; the refusal reason stays."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder = _copy(onnx_folder, tmp_path / "other-q8")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "phi3"}))
    quantize_dynamic(onnx_folder / "model.onnx", folder / "model.onnx", weight_type=QuantType.QInt8,
                     extra_options={"MatMulConstBOnly": True})
    model = _model(folder, tmp_path / "cache", max_batch_size=3)
    try:
        assert not model.folder.kv_in_place and model.folder.model_path.is_relative_to(tmp_path / "cache")
        ops = collections.Counter(n.op_type for n in onnx.load(str(model.folder.model_path),
                                                               load_external_data=False).graph.node)
        exported = collections.Counter(n.op_type for n in onnx.load(str(folder / "model.onnx")).graph.node)
        assert ops["DynamicQuantizeLinear"] == 0 and ops["MatMulInteger"] == exported["MatMulInteger"] > 0
        _decodes_alike_alone_and_batched(model)
    finally:
        model.close()
