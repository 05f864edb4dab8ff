"""Decoder folders quantized to int4/int8 weights (``edge-runtime quantize --mode int4|int8``) serve like any other.

Oracle: the no-cache recompute (``oracle_greedy``) on the quantized folder
itself: the engine's KV-cache path, continuous batching and prefill chunks
must give the tokens a full recompute gives, whatever the weights' precision.
The folders are real ``optimum`` exports of ``transformers`` models.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from generation_fixtures import oracle_greedy


@pytest.mark.parametrize("mode,kernel", [("int4", "auto"), ("int8", "matmulnbits"), ("int8", "matmulinteger")])
def test_a_quantized_optimum_export_decodes_greedily_like_its_no_cache_oracle(onnx_folder: Path, tmp_path: Path,
                                                                              model_factory, mode: str,
                                                                              kernel: str) -> None:
    from edge_runtime.optimize.decoder_quant import quantize_decoder

    result = quantize_decoder(onnx_folder, tmp_path / mode, mode, kernel=kernel)
    ops = [n.op_type for n in onnx.load(str(tmp_path / mode / "model.onnx")).graph.node]
    assert ops.count(result.kernel) == result.matmuls_quantized > 0
    assert kernel == "auto" or result.kernel.lower() == kernel
    model = model_factory(tmp_path / mode, max_batch_size=2, prefill_chunk_tokens=8)
    messages = [{"role": "user", "content": "open the settings menu then scroll down"}]
    prompts = [model.prepare(messages=messages).ids, model.prepare(prompt="tap the back button twice").ids]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:  # two at once: batched decode rows over quantized weights
        results = list(pool.map(lambda ids: model.generate(prompt=ids, max_tokens=12), prompts))
    eos = set(model.folder.eos_token_ids)
    for ids, got in zip(prompts, results):
        assert list(got.token_ids) == oracle_greedy(tmp_path / mode, ids, 12, eos)


@pytest.mark.aarch64  # the integer types follow the CPU: on arm64 signed int8 activations (sdot), u8 x s8 on x86
@pytest.mark.parametrize("kernel", ["auto", "matmulinteger"])
def test_int8_on_this_cpu_times_its_kernels_and_decodes_concurrent_streams_like_the_no_cache_oracle(
        tmp_path: Path, model_factory, kernel: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from edge_runtime.decoder_zoo import DecoderShape, write_decoder_folder
    from edge_runtime.optimize.decoder_quant import AUTO_ROWS, fastest, quantize_decoder
    from edge_runtime.optimize.quantize import host_int8_settings

    folder = write_decoder_folder(tmp_path / "fp32", DecoderShape(vocab=600, max_positions=128), seed=1, std=0.05)
    result = quantize_decoder(folder, tmp_path / "int8", "int8", kernel=kernel)
    if kernel == "auto":  # both kernels timed here, at one and at eight rows, and the rule's pick written
        timed = {"MatMulNBits level 4"} | (set() if host_int8_settings().reduce_range else {"MatMulInteger"})
        assert result.step_ms is not None and set(result.step_ms) == timed
        assert all(sorted(by_rows) == sorted(AUTO_ROWS) for by_rows in result.step_ms.values())
        chosen = result.kernel if result.accuracy_level is None else f"{result.kernel} level {result.accuracy_level}"
        assert chosen == fastest(result.step_ms)
    else:
        assert result.kernel == "MatMulInteger" and result.step_ms is None
    model = model_factory(tmp_path / "int8", max_batch_size=2, prefill_chunk_tokens=8)
    prompts = [model.prepare(messages=[{"role": "user", "content": "open the settings menu then scroll down"}]).ids,
               model.prepare(prompt="tap the back button twice").ids]
    with ThreadPoolExecutor(2) as pool:  # two at once: batched decode rows, each with its own activation scales
        results = list(pool.map(lambda ids: model.generate(prompt=ids, max_tokens=12), prompts))
    eos = set(model.folder.eos_token_ids)
    for ids, got in zip(prompts, results):
        assert list(got.token_ids) == oracle_greedy(tmp_path / "int8", ids, 12, eos)
