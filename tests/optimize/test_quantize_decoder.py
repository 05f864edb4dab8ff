"""int4/int8 weight-only quantization of decoder folders (``edge-runtime quantize FOLDER --mode int4|int8``).

Oracles: the ``MatMulNBits`` contract as onnxruntime's contrib-op spec writes it
(packed ``B``, one scale per block, zero point 2^(bits-1) when none is given),
dequantized here in numpy and put back into the fp32 graph, run by plain ONNX
Runtime; torch's ``log_softmax``/``kl_div`` on the logits ONNX Runtime gives
for the drift report; the command line for the user-facing errors.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from edge_runtime.decoder_zoo import DecoderShape, write_decoder_folder
from edge_runtime.generation.engine import kv_names
from edge_runtime.generation.folder import read_folder

ROOT = Path(__file__).resolve().parents[2]
SHAPE = DecoderShape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=600, max_positions=128)
TEXT = "tap the settings icon, then scroll down to the network entry and open it. " * 6


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # std 0.05: logits of a moderate scale, so greedy picks are not near-ties everywhere
    return write_decoder_folder(tmp_path_factory.mktemp("dq") / "fp32", SHAPE, seed=4, std=0.05)


def quantized(decoder: Path, root: Path, mode: str, **kwargs: int | str) -> Path:
    from edge_runtime.optimize.decoder_quant import quantize_decoder

    out = root / f"{mode}-{kwargs.get('accuracy_level', 'auto')}-{kwargs.get('kernel', 'auto')}"
    if not (out / "model.onnx").is_file():
        quantize_decoder(decoder, out, mode, **kwargs)
    return out


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def logits_of(folder: Path, tokens: list[int]) -> np.ndarray:
    description = read_folder(folder)
    n, layout = len(tokens), description.kv
    feeds = {"input_ids": np.array([tokens], np.int64), "attention_mask": np.ones((1, n), np.int64),
             "position_ids": np.arange(n, dtype=np.int64)[None]}
    for name in kv_names(layout.layers)[0]:
        feeds[name] = np.zeros((1, layout.kv_heads, 0, layout.head_dim), layout.dtype)
    return session(description.model_path).run(["logits"], feeds)[0][0]


def dequantized_weights(model: onnx.ModelProto) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{original weight name: (W [K, N] dequantized per the MatMulNBits spec, per-element scale)}, and the
    embedding table [vocab, hidden] per the GatherBlockQuantized spec (blocks along the hidden axis)."""
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.op_type == "GatherBlockQuantized":
            out.update(dequantized_table(node, init))
            continue
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        k, n, bits, block = attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]
        assert len(node.input) < 4 or not node.input[3], "symmetric: no zero points expected"
        packed = init[node.input[1]].reshape(n, -1)  # [N, blocks * block * bits / 8] bytes
        if bits == 4:  # two values a byte, the low nibble first
            values = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, -1)
        else:
            values = packed
        blocks = math.ceil(k / block)
        scales = init[node.input[2]].reshape(n, blocks).astype(np.float32)
        per_element = np.repeat(scales, block, axis=1)[:, :k]
        w = (values[:, :k].astype(np.float32) - 2 ** (bits - 1)) * per_element
        original = node.input[1].rsplit("_Q", 1)[0]
        out[original] = (w.T, np.abs(per_element.T))  # symmetric scales carry the sign of the block's extreme
    return out


def dequantized_table(node: onnx.NodeProto, init: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{original table name: (table [vocab, hidden] dequantized per the GatherBlockQuantized spec, per-element
    scale)}: uint8 data, ``bits`` a value packed low bits first along the last axis, blocks along the last
    axis (a tied table read from the head's 3-D ``B``: one block per row of its last axis), no zero points
    (the default 2^(bits-1)). The table keeps its name in its scales' (its data may be the head's)."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    packed, scales = init[node.input[0]], init[node.input[2]].astype(np.float32)
    assert attrs["gather_axis"] == 0 and attrs["quantize_axis"] == packed.ndim - 1 and len(node.input) == 3
    bits, block = attrs["bits"], attrs["block_size"]
    assert packed.dtype == np.uint8 and scales.shape[-1] == packed.shape[-1] * 8 // bits // block
    values = np.stack([packed & 0x0F, packed >> 4], axis=-1) if bits == 4 else packed
    values = values.reshape(len(packed), -1)
    per_element = np.repeat(scales.reshape(len(packed), -1), block, axis=1)
    assert per_element.shape == values.shape
    table = (values.astype(np.float32) - 2 ** (bits - 1)) * per_element
    return {node.input[2].rsplit("_scales", 1)[0]: (table, np.abs(per_element))}


@pytest.mark.parametrize("mode,bits", [("int4", 4), ("int8", 8)])
def test_quantized_matmuls_compute_the_dequantized_weights_within_one_step(decoder: Path, tmp_path: Path,
                                                                           mode: str, bits: int) -> None:
    out = quantized(decoder, tmp_path, mode, accuracy_level=0)  # level 0: fp32 compute, exact to the spec
    model, source = onnx.load(str(out / "model.onnx")), onnx.load(str(decoder / "model.onnx"))
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    tables = [n for n in model.graph.node if n.op_type == "GatherBlockQuantized"]
    weights = dequantized_weights(model)
    original = {t.name: numpy_helper.to_array(t) for t in source.graph.initializer}
    # every projection and the LM head: per layer the fused q/k/v, o, fused gate/up, down; then lm_head; and
    # the token-embedding table, read by input_ids, in the same bits (no float table of its shape left)
    assert len(nbits) == 4 * SHAPE.layers + 1 and set(weights) <= set(original)
    assert len(tables) == 1 and tables[0].input[1] == "input_ids"
    assert not any(t.dims == [SHAPE.vocab, SHAPE.hidden] and t.data_type == onnx.TensorProto.FLOAT
                   for t in model.graph.initializer)
    assert {onnx.helper.get_attribute_value(a) for n in nbits + tables for a in n.attribute
            if a.name == "bits"} == {bits}
    for name, (w, scale) in weights.items():
        error = np.abs(w - original[name])
        assert np.all(error <= scale * 1.0001 + 1e-7), name  # rounding, or clipping of the largest value
        assert error.mean() <= 0.3 * scale.mean(), name  # rounding error averages a quarter step
    # Put the dequantized weights into the fp32 graph: the quantized model must compute exactly that.
    for tensor in source.graph.initializer:
        if tensor.name in weights:
            tensor.CopyFrom(numpy_helper.from_array(weights[tensor.name][0].astype(np.float32), tensor.name))
    oracle = tmp_path / "oracle"
    oracle.mkdir()
    for f in decoder.iterdir():
        if f.name != "model.onnx":
            (oracle / f.name).write_bytes(f.read_bytes())
    onnx.save(source, str(oracle / "model.onnx"))
    tokens = list(range(3, 40))
    np.testing.assert_allclose(logits_of(out, tokens), logits_of(oracle, tokens), atol=2e-4, rtol=1e-4)
    assert not np.allclose(logits_of(out, tokens), logits_of(decoder, tokens), atol=2e-4)  # it did quantize


def test_the_drift_report_equals_torch_on_onnxruntime_logits(decoder: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer

    from edge_runtime.optimize.decoder_drift import decoder_drift

    out = quantized(decoder, tmp_path, "int4")
    drift = decoder_drift(decoder, out, TEXT, window=40)
    ids = Tokenizer.from_file(str(decoder / "tokenizer.json")).encode(TEXT, add_special_tokens=False).ids
    windows = [w for w in (ids[i:i + 40] for i in range(0, len(ids), 40)) if len(w) >= 2]
    nll = {"ref": 0.0, "cand": 0.0}
    kl, agree = [], 0
    for w in windows:
        ref = torch.log_softmax(torch.from_numpy(logits_of(decoder, w)).double(), -1)
        cand = torch.log_softmax(torch.from_numpy(logits_of(out, w)).double(), -1)
        target = torch.tensor(w[1:])
        nll["ref"] += float(torch.nn.functional.nll_loss(ref[:-1], target, reduction="sum"))
        nll["cand"] += float(torch.nn.functional.nll_loss(cand[:-1], target, reduction="sum"))
        kl.append(torch.nn.functional.kl_div(cand, ref, log_target=True, reduction="none").sum(-1))
        agree += int((ref.argmax(-1) == cand.argmax(-1)).sum())
    predicted = sum(len(w) - 1 for w in windows)
    kl_all = torch.cat(kl)
    assert drift.windows == len(windows) and drift.tokens == len(kl_all)
    assert drift.perplexity_reference == pytest.approx(math.exp(nll["ref"] / predicted), rel=1e-4)
    assert drift.perplexity_candidate == pytest.approx(math.exp(nll["cand"] / predicted), rel=1e-4)
    assert drift.kl_mean == pytest.approx(float(kl_all.mean()), rel=1e-3, abs=1e-9)
    assert drift.kl_max == pytest.approx(float(kl_all.max()), rel=1e-3, abs=1e-9)
    assert drift.greedy_agreement == pytest.approx(agree / len(kl_all))
    assert drift.kl_mean > 0  # int4 does drift


def test_eight_bits_drift_less_than_four(decoder: Path, tmp_path: Path) -> None:
    from edge_runtime.optimize.decoder_drift import decoder_drift

    four = decoder_drift(decoder, quantized(decoder, tmp_path, "int4"), TEXT, window=64)
    eight = decoder_drift(decoder, quantized(decoder, tmp_path, "int8"), TEXT, window=64)
    assert eight.kl_mean < four.kl_mean / 4
    assert eight.max_abs_logit < four.max_abs_logit
    assert abs(eight.perplexity_candidate / eight.perplexity_reference - 1) < 0.01


@pytest.mark.parametrize("mode,bits", [("int4", 4), ("int8", 8)])
def test_float_embeddings_keep_the_table_and_cost_its_bytes(decoder: Path, tmp_path: Path, mode: str,
                                                            bits: int) -> None:
    """``embeddings=False`` (``--float-embeddings``) leaves the embedding Gather and its fp32 table as they
    were; the default stores the table in ``bits`` and, the test decoder's head being tied, reads the
    head's integers rather than a copy: the folder is smaller by about the table's fp32 bytes less its
    scales, and the quantized table's rows are used (the logits differ)."""
    from edge_runtime.optimize.decoder_quant import quantize_decoder

    kept = quantize_decoder(decoder, tmp_path / "kept", mode, kernel="matmulnbits", accuracy_level=0,
                            embeddings=False)
    packed = quantize_decoder(decoder, tmp_path / "packed", mode, kernel="matmulnbits", accuracy_level=0)
    assert kept.embeddings_quantized == () and len(packed.embeddings_quantized) == 1
    graph = onnx.load(str(tmp_path / "kept" / "model.onnx")).graph
    tables = {t.name: t for t in graph.initializer}
    gathers = [n for n in graph.node if n.op_type == "Gather" and n.input[1] == "input_ids"]
    assert len(gathers) == 1 and tables[gathers[0].input[0]].data_type == onnx.TensorProto.FLOAT
    assert not any(n.op_type == "GatherBlockQuantized" for n in graph.node)
    table_bytes = SHAPE.vocab * SHAPE.hidden * 4
    stored = SHAPE.vocab * SHAPE.hidden // 32 * 4  # its scales: the integers are the head's
    graph = onnx.load(str(tmp_path / "packed" / "model.onnx")).graph
    head = next(n for n in graph.node if n.op_type == "MatMulNBits" and n.output[0] == "logits")
    assert [n.input[0] for n in graph.node if n.op_type == "GatherBlockQuantized"] == [head.input[1]]
    saved = kept.out_bytes - packed.out_bytes
    assert abs(saved - (table_bytes - stored)) < 0.05 * table_bytes, (saved, table_bytes - stored)
    tokens = list(range(3, 40))
    assert not np.allclose(logits_of(tmp_path / "kept", tokens), logits_of(tmp_path / "packed", tokens), atol=1e-5)


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_the_auto_kernel_is_the_fastest_measured_one_and_the_written_graph_uses_it(
        decoder: Path, tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    from edge_runtime.optimize.decoder_drift import DEFAULT_TEXT, decoder_drift
    from edge_runtime.optimize.decoder_quant import AUTO_KERNELS, AUTO_ROWS, PRECISION_SLACK, QUANTIZATION_FILE
    from edge_runtime.optimize.quantize import host_int8_settings

    out = quantized(decoder, tmp_path, mode)  # the default: auto, measured on this machine
    record = json.loads((out / QUANTIZATION_FILE).read_text())
    measured = {name: {int(rows): ms for rows, ms in by_rows.items()} for name, by_rows in record["step_ms"].items()}
    # x86 without VNNI keeps int8 on MatMulNBits (7-bit integer weights are not offered)
    expected = [k.name for k in AUTO_KERNELS[mode] if k.op == "MatMulNBits" or not host_int8_settings().reduce_range]
    assert record["kernel_choice"] == "auto" and sorted(measured) == sorted(expected)
    assert all(sorted(by_rows) == sorted(AUTO_ROWS) and all(ms > 0 for ms in by_rows.values())
               for by_rows in measured.values())
    # The rule, restated: among the kernels within PRECISION_SLACK of the smallest drift, the smallest worst
    # ratio to the fastest at each row count. Each drift is the mean KL on the default text, as decoder_drift
    # (torch-checked below) measures it on the folder written with that kernel.
    drift = record["kl_mean"]
    assert sorted(drift) == sorted(measured) and all(kl > 0 for kl in drift.values())
    eligible = {name: by_rows for name, by_rows in measured.items() if drift[name] <= PRECISION_SLACK * min(
        drift.values())}
    worst = {name: max(by_rows[r] / min(m[r] for m in eligible.values()) for r in AUTO_ROWS)
             for name, by_rows in eligible.items()}
    chosen = min(worst, key=worst.get)
    assert chosen == (record["kernel"] if record["accuracy_level"] is None
                      else f"{record['kernel']} level {record['accuracy_level']}")
    nodes = onnx.load(str(out / "model.onnx")).graph.node
    assert sum(n.op_type == record["kernel"] for n in nodes) == record["matmuls_quantized"] == 4 * SHAPE.layers + 1
    levels = {onnx.helper.get_attribute_value(a) for n in nodes
              if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "accuracy_level"}
    assert levels == ({record["accuracy_level"]} if record["kernel"] == "MatMulNBits" else set())
    # The same weights as a folder quantized with that kernel given: the same logits, bit for bit.
    given_kernel = ({"accuracy_level": record["accuracy_level"]} if record["kernel"] == "MatMulNBits"
                    else {"kernel": "matmulinteger"})
    given = quantized(decoder, tmp_path, mode, **given_kernel)
    tokens = list(range(3, 40))
    np.testing.assert_array_equal(logits_of(out, tokens), logits_of(given, tokens))
    written = decoder_drift(decoder, out, TEXT, window=64)
    assert written.greedy_agreement >= (0.9 if mode == "int8" else 0.6)  # still close to fp32's greedy picks
    # the check's figure for the chosen kernel is decoder_drift's on the written folder (same text and windows)
    same = decoder_drift(decoder, out, DEFAULT_TEXT, window=256, max_tokens=512)
    assert drift[chosen] == pytest.approx(same.kl_mean, rel=1e-3)
    from edge_runtime.generation.model import load_generative

    with caplog.at_level("INFO", logger="edge_runtime.generation.model"):
        load_generative(out, "q", threads=1).close()
    assert f"{mode} weights, {record['kernel']} " in caplog.text and "(auto;" in caplog.text  # a load says it


def cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGE_RUNTIME_CACHE": str(cache), "PYTHONPATH": str(ROOT), "EDGE_RUNTIME_THREADS": "2"}
    return subprocess.run([sys.executable, "-m", "edge_runtime", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_the_command_writes_a_folder_that_generates_and_reports_on_the_given_text(decoder: Path,
                                                                                 tmp_path: Path) -> None:
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.optimize.decoder_quant import QUANTIZATION_FILE

    text = tmp_path / "agent.txt"
    text.write_text(TEXT)
    out = tmp_path / "int4"
    result = cli("quantize", str(decoder), "--mode", "int4", "--out", str(out), "--calibration", str(text),
                 "--block-size", "16", "--rounds", "1", "--new-tokens", "4", "--json", cache=tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["text_from"] == str(text) and report["block_size"] == 16 and report["bits"] == 4
    assert report["kernel_choice"] == "auto" and report["kernel"] == "MatMulNBits"  # int4: MatMulNBits only
    assert f"MatMulNBits level {report['accuracy_level']}" in report["step_ms"]
    assert report["matmuls_quantized"] == 4 * SHAPE.layers + 1
    assert report["out_bytes"] < 0.5 * report["source_bytes"]
    assert report["drift"]["tokens"] > 50 and 0 < report["drift"]["greedy_agreement"] <= 1
    assert report["speed"]["reference_tokens_per_s"] > 0 and report["speed"]["candidate_tokens_per_s"] > 0
    assert report["embeddings_quantized"] and report["matmuls_quantized"] == 4 * SHAPE.layers + 1
    # the source's files, the record, and the weights beside the graph (ONNX Runtime maps them; none inline)
    assert sorted(p.name for p in out.iterdir()) == sorted([p.name for p in decoder.iterdir()]
                                                           + [QUANTIZATION_FILE, "model.onnx.data"])
    assert not [t.name for t in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.initializer
                if t.data_location != onnx.TensorProto.EXTERNAL and len(t.raw_data) > 1024]
    model = GenerativeModel("q", out, GenerationSettings(), threads=1)
    try:
        assert model.generate(prompt="open the settings", max_tokens=5, ignore_eos=True).usage.completion_tokens == 5
    finally:
        model.close()
    text_out = cli("quantize", str(decoder), "--mode", "int8", "--out", str(tmp_path / "int8"), "--rounds", "1",
                   "--new-tokens", "3", cache=tmp_path / "cache")
    assert text_out.returncode == 0, text_out.stderr
    assert "int8: wrote" in text_out.stdout and "greedy agreement" in text_out.stdout
    assert "tokens/s" in text_out.stdout and "of the default text" in text_out.stdout
    assert "kernel chosen by measurement" in text_out.stdout and "MatMulNBits level 4" in text_out.stdout


@pytest.mark.parametrize("case,needle", [
    ("folder-dynamic", "a decoder folder takes --mode int4 or int8"),
    ("file-int4", "for an ONNX model file use --mode dynamic, static or fp16"),
    ("block", "block size must be a power of two from 16 to 256, got 48"),
    ("binary-text", "cannot read"),
    ("same-folder", "--out must be a new folder"),
    ("integer-int4", "--kernel matmulinteger takes --mode int8"),
    ("integer-level", "--kernel matmulinteger takes none, got 4"),
    ("not-a-decoder", "no model.onnx"),
])
def test_wrong_arguments_get_a_clear_error(decoder: Path, tmp_path: Path, case: str, needle: str) -> None:
    binary = tmp_path / "calib.txt"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "tokenizer.json").write_text("{}")
    args = {
        "folder-dynamic": [str(decoder), "--mode", "dynamic", "--out", str(tmp_path / "o")],
        "file-int4": [str(decoder / "model.onnx"), "--mode", "int4", "--out", str(tmp_path / "o")],
        "block": [str(decoder), "--mode", "int4", "--block-size", "48", "--out", str(tmp_path / "o")],
        "binary-text": [str(decoder), "--mode", "int4", "--calibration", str(binary), "--out", str(tmp_path / "o")],
        "same-folder": [str(decoder), "--mode", "int8", "--out", str(decoder)],
        "integer-int4": [str(decoder), "--mode", "int4", "--kernel", "matmulinteger", "--out", str(tmp_path / "o")],
        "integer-level": [str(decoder), "--mode", "int8", "--kernel", "matmulinteger", "--accuracy-level", "4",
                          "--out", str(tmp_path / "o")],
        "not-a-decoder": [str(empty), "--mode", "int8", "--out", str(tmp_path / "o")],
    }[case]
    result = cli("quantize", *args, cache=tmp_path / "cache")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert needle in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "o" / "model.onnx").exists()


def test_auto_weighs_speed_only_among_kernels_near_the_smallest_drift() -> None:
    from edge_runtime.optimize.decoder_quant import PRECISION_SLACK, fastest

    steps = {"MatMulNBits level 4": {1: 2.0, 8: 7.0}, "MatMulInteger": {1: 2.1, 8: 3.2}}
    assert fastest(steps) == "MatMulInteger"  # level alone, far ahead at eight rows
    near = {"MatMulNBits level 4": 1e-4, "MatMulInteger": PRECISION_SLACK * 1e-4}
    assert fastest(steps, near) == "MatMulInteger"
    far = {"MatMulNBits level 4": 1e-4, "MatMulInteger": PRECISION_SLACK * 1.01e-4}
    assert fastest(steps, far) == "MatMulNBits level 4"  # too far from the most precise: speed does not buy it
    alone = {"a": {1: 1.0, 8: 10.0}, "b": {1: 1.5, 8: 8.0}}  # worst ratios: a 1.25, b 1.5
    assert fastest(alone) == "a"


def test_a_model_past_the_protobuf_limit_is_timed_and_written_whole(decoder: Path, tmp_path: Path,
                                                                   monkeypatch) -> None:
    """Past protobuf's 2 GiB the timed candidates are saved with external data, which empties the graph
    saved; the one chosen is written afterwards, so it must still hold its weights (the limit lowered
    here so a tiny model takes that path)."""
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.optimize import decoder_quant

    monkeypatch.setattr(decoder_quant, "_PROTOBUF_LIMIT", 1024)
    out = tmp_path / "int4"
    result = decoder_quant.quantize_decoder(decoder, out, "int4", kernel="matmulnbits")  # timed: levels 0, 4
    assert result.step_ms is not None
    model = GenerativeModel("q", out, GenerationSettings(), threads=1)
    try:
        assert model.generate(prompt="open the settings", max_tokens=3, ignore_eos=True).usage.completion_tokens == 3
    finally:
        model.close()


def test_an_untied_head_keeps_the_table_its_own_integers(decoder: Path) -> None:
    """Only a head holding the very integers and scales of the table serves as it: with the head's weights
    changed (an untied model), the Gather keeps its own table."""
    from edge_runtime.optimize.decoder_quant import matmul_nbits
    from edge_runtime.optimize.embedding_quant import quantize_embeddings, share_tied_table

    for untie in (False, True):
        model = onnx.load(str(decoder / "model.onnx"))
        if untie:
            head = next(t for t in model.graph.initializer if t.name.startswith("lm_head"))
            head.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(head) * 1.5, head.name))
        converted = matmul_nbits(model, 4, 32, 0)
        tables = quantize_embeddings(converted, 4, 32)
        shared = share_tied_table(converted)
        assert len(tables) == 1 and bool(shared) is not untie, (untie, shared)
        gather = next(n for n in converted.graph.node if n.op_type == "GatherBlockQuantized")
        head = next(n for n in converted.graph.node if n.op_type == "MatMulNBits" and n.output[0] == "logits")
        assert (gather.input[0] == head.input[1]) is not untie
