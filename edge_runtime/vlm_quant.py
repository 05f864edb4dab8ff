"""Quantized parts of a converted VLM folder, named as transformers.js names them.

``convert --to onnx --quantize`` writes, beside the fp32 parts:

* ``onnx/vision_encoder_quantized.onnx`` and ``onnx/decoder_model_merged_quantized.onnx``
  (transformers.js' ``q8``): int8 MatMuls (weights int8 per output channel, attention, norms and
  rotary fp32). The encoder: ONNX Runtime's dynamic quantization (activations quantized per call:
  one image's patches). The decoder: ``optimize.per_token_int8`` (activations quantized per
  token), because in a continuous batch a per-call scale would make a row's rounding depend on
  the other rows of the step — the same request would answer differently alone and beside others.
  Both take u8 activations x s8 weights, as ``quantize_dynamic`` does, which ONNX Runtime runs
  with VNNI on x86 and dot-product instructions on ARM. The prefill-heavy form: on the
  benchmark's CPU its int8 matrix products ran 2.9x the fp32 ones at 256+ rows;
* ``onnx/decoder_model_merged_q4.onnx`` and ``_int8.onnx``: weight-only ``MatMulNBits`` (4 and
  8 bits, ``optimize.decoder_quant``'s settings: blocks of 32, int8 compute), the decode-heavy
  form (a quarter / half of the weight bytes to stream per token; at 256+ rows it ran no faster
  than fp32 there). External data in ``<file>_data`` like the fp32 decoder;
* ``onnx/vision_encoder_q4.onnx``: the encoder's MatMuls as 4-bit ``MatMulNBits`` (the same
  settings), a quarter of its weight bytes;
* ``onnx/embed_tokens_quantized.onnx`` and ``_q4.onnx``: the embedding table in 8 / 4 bits, blocks
  of 32 along the hidden axis, read by ``GatherBlockQuantized`` (``optimize.embedding_quant``: the
  largest tensor of a small VLM at its real vocabulary — Qwen2-VL-2B's is 233M values, 0.9 GB in
  fp32).

The converter builds the three decoders from the checkpoint, each weight quantized as it is read
(``QuantizedOnRead``, ``vlm_parts.iter_quantized_decoders``): the same integers and scales as
quantizing the written fp32 decoder (``quantize_decoder_nbits`` / ``quantize_decoder_per_token``,
kept for folders converted before), without holding its fp32 weights in memory.

So transformers.js' one-name ``dtype: "q8"`` or ``"q4"`` finds every part it asks for (``int8``, as
it names 8-bit MatMulNBits, exists for the decoder only). MatMuls that turn
integer positions into rotary angles (``rope_freq`` [2, d], ``mrope_freq`` [3, d]) stay fp32:
a per-call int8 scale would round the positions. The ``[vision] precision`` table picks the
parts per model, e.g. ``{decoder = "q8", vision_encoder = "q8"}``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edge_runtime.generation.folder import SUFFIXES

log = logging.getLogger(__name__)

# precision (``generation.folder.SUFFIXES`` key) -> the decoder's MatMulNBits bits
DECODER_BITS = {"q4": 4, "int8": 8}
# precision -> the embedding table's bits (q8 is transformers.js' "quantized": its 8-bit files)
EMBEDDING_BITS = {"q8": 8, "q4": 4}
# No real linear layer has this few inputs; the position-to-angle products do (2 or 3 rows).
_MIN_LINEAR_INPUTS = 16


def _portable_int8() -> Any:
    from edge_runtime.optimize.quantize import Int8Settings

    # What the folder takes wherever it runs: u8 activations around 128 x s8 weights over the full 8 bits
    # (quantize_dynamic's defaults; a 7-bit range would only matter on x86 without VNNI).
    return Int8Settings(activation_signed=False, reduce_range=False,
                        why="portable: u8 activations x s8 weights, as quantize_dynamic writes")



def write_quantized_parts(folder: Path, decoders: bool = True) -> dict[str, int]:
    """Write the quantized parts of the converted ``folder`` (see the module docstring); returns the
    ``use_external_data_format`` entries of the files written with external data. ``decoders`` False:
    the quantized decoders are written elsewhere (the converter builds them from the checkpoint,
    ``vlm_parts.iter_quantized_decoders``)."""
    onnx_dir = Path(folder) / "onnx"
    external: dict[str, int] = {}
    external.update(quantize_dynamic_int8(onnx_dir / "vision_encoder.onnx", onnx_dir / "vision_encoder_quantized.onnx"))
    external.update(quantize_nbits(onnx_dir, "vision_encoder", "vision_encoder_q4", 4))
    if decoders:
        external.update(quantize_decoder_per_token(onnx_dir, "decoder_model_merged_quantized"))
        for precision, bits in DECODER_BITS.items():
            external.update(quantize_decoder_nbits(onnx_dir, f"decoder_model_merged_{precision}", bits))
    for precision, bits in EMBEDDING_BITS.items():
        external.update(quantize_embed_tokens(onnx_dir, f"embed_tokens{SUFFIXES[precision]}", bits))
    return external


class QuantizedOnRead(Mapping[str, Any]):
    """A decoder's Hugging Face-named weights with every linear layer's weight quantized as the builder
    reads it (``quantize``), the rest as they are: a checkpoint converted one tensor at a time, where
    quantizing the written fp32 graph holds all of it in memory (a 9B decoder: 36 GB of fp32 weights)."""

    def __init__(self, source: Mapping[str, Any]) -> None:
        self.source = source

    @staticmethod
    def is_linear(name: str) -> bool:
        """A weight the decoder multiplies activations by: projections and the LM head (the embedding
        table's name too, which a tied head reads; the VLM decoder takes embeddings, not ids)."""
        return name.endswith("_proj.weight") or name in ("lm_head.weight", "model.embed_tokens.weight")

    def quantize(self, weight: Any) -> Any:
        raise NotImplementedError

    def __getitem__(self, name: str) -> Any:
        import numpy as np

        value = self.source[name]
        return self.quantize(np.asarray(value, np.float32)) if self.is_linear(name) else value

    def __contains__(self, name: object) -> bool:
        return name in self.source

    def __iter__(self):
        return iter(self.source)

    def __len__(self) -> int:
        return len(self.source)


class NBitsQuantized(QuantizedOnRead):
    """``decoder_zoo.NBitsWeight``s: ``bits``-bit symmetric blocks of ``DEFAULT_BLOCK_SIZE`` at the converter's
    accuracy level, from ONNX Runtime's block quantizer called per weight: the integers and scales
    ``quantize_nbits`` gets from its quantizer over the fp32 graph."""

    def __init__(self, source: Mapping[str, Any], bits: int) -> None:
        from onnxruntime.quantization.matmul_nbits_quantizer import (DefaultWeightOnlyQuantConfig,
                                                                     DefaultWeightOnlyQuantizer)

        from edge_runtime.optimize.decoder_quant import DEFAULT_BLOCK_SIZE

        super().__init__(source)
        self.bits, self.block_size = bits, DEFAULT_BLOCK_SIZE
        self.quantizer = DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(
            block_size=DEFAULT_BLOCK_SIZE, is_symmetric=True, bits=bits))

    def quantize(self, weight: Any) -> Any:
        import numpy as np

        from edge_runtime.decoder_zoo import NBitsWeight
        from edge_runtime.optimize.decoder_quant import CONVERTER_ACCURACY_LEVEL

        packed, scales, _ = self.quantizer.qbits_block_quant(np.ascontiguousarray(weight.T))  # [K, N]
        return NBitsWeight(packed, scales, None, weight.shape[1], self.bits, self.block_size, CONVERTER_ACCURACY_LEVEL)


class Int8Quantized(QuantizedOnRead):
    """``decoder_zoo.Int8Weight``s: int8, symmetric, one scale per output (``max |w| / 127``), the integers
    ``optimize.per_token_int8`` computes from an fp32 weight; it then keeps them (``only_given``)."""

    def quantize(self, weight: Any) -> Any:
        from edge_runtime.decoder_zoo import Int8Weight
        from edge_runtime.optimize.per_token_int8 import int8_columns

        q, scale = int8_columns(weight.T)  # the MatMul's [K, N]: one scale per output
        return Int8Weight(q.T, scale)


def per_token_given(proto: Any) -> Any:
    """A decoder built from ``Int8Quantized`` weights (DequantizeLinear of int8) as ``quantize_decoder_per_token``
    writes it: per-token int8 ``MatMulInteger`` on the same integers and scales."""
    from edge_runtime.optimize.per_token_int8 import per_token_int8

    quantized, done = per_token_int8(proto, _portable_int8(), exclude=angle_matmuls(proto), only_given=True)
    log.info("decoder: per-token int8 MatMulInteger from the checkpoint's weights (%d of them)", done)
    return quantized


def angle_matmuls(proto: Any) -> list[str]:
    """Names of the MatMul nodes whose constant weight has fewer than ``_MIN_LINEAR_INPUTS`` rows."""
    rows = {t.name: t.dims[0] for t in proto.graph.initializer if len(t.dims) == 2}
    return [n.name for n in proto.graph.node
            if n.op_type == "MatMul" and rows.get(n.input[1], _MIN_LINEAR_INPUTS) < _MIN_LINEAR_INPUTS]


def quantize_dynamic_int8(source: Path, out: Path) -> dict[str, int]:
    """``onnxruntime.quantization.quantize_dynamic`` over the MatMuls, weights int8 per channel (one
    scale per output column: a few large columns would cost the rest precision under one scale); the
    weights then moved beside the graph as every part keeps them (``vlm_parts.save_part``)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from edge_runtime.vlm_parts import save_part

    proto = onnx.load(str(source), load_external_data=False)
    exclude = angle_matmuls(proto)
    del proto
    quiet = logging.getLogger()  # the quantizer advises "pre-processing" through the root logger
    previous = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        # NOTE: int8 weights are a quarter of fp32: the output fits a protobuf (2 GiB) for any part under
        # 8 GiB of fp32 weights, before save_part moves them out. DefaultTensorType: shape inference cannot type the
        # outputs of contrib ops (GroupQueryAttention), which feed the following MatMuls.
        quantize_dynamic(source, out, op_types_to_quantize=["MatMul"], per_channel=True,
                         weight_type=QuantType.QInt8, nodes_to_exclude=exclude,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        quiet.setLevel(previous)
    external: dict[str, int] = {}
    save_part(onnx.load(str(out)), out.parent, out.stem, external)
    log.info("%s -> %s (dynamic int8 MatMuls; kept fp32: %s)", source.name, out.name, exclude)
    return external


def quantize_decoder_per_token(onnx_dir: Path, stem: str) -> dict[str, int]:
    """``decoder_model_merged.onnx`` with per-token int8 MatMuls as ``onnx_dir/<stem>.onnx``."""
    import onnx

    from edge_runtime.optimize.per_token_int8 import per_token_int8
    from edge_runtime.vlm_parts import save_part

    proto = onnx.load(str(onnx_dir / "decoder_model_merged.onnx"))
    quantized, done = per_token_int8(proto, _portable_int8(), exclude=angle_matmuls(proto))
    external: dict[str, int] = {}
    save_part(quantized, onnx_dir, stem, external)
    log.info("decoder: %s (per-token int8 MatMulInteger, %d of them)", stem, done)
    return external


def quantize_decoder_nbits(onnx_dir: Path, stem: str, bits: int) -> dict[str, int]:
    """``decoder_model_merged.onnx`` with ``bits``-bit MatMulNBits as ``onnx_dir/<stem>.onnx`` (+ ``_data``)."""
    return quantize_nbits(onnx_dir, "decoder_model_merged", stem, bits)


def quantize_nbits(onnx_dir: Path, source: str, stem: str, bits: int) -> dict[str, int]:
    """``onnx_dir/<source>.onnx`` with ``bits``-bit MatMulNBits as ``<stem>.onnx`` (+ ``_data``)."""
    import onnx

    from edge_runtime.optimize.decoder_quant import CONVERTER_ACCURACY_LEVEL, DEFAULT_BLOCK_SIZE, matmul_nbits
    from edge_runtime.vlm_parts import save_part

    proto = onnx.load(str(onnx_dir / f"{source}.onnx"))  # weights in memory: the quantizer reads them
    quantized = matmul_nbits(proto, bits, DEFAULT_BLOCK_SIZE, CONVERTER_ACCURACY_LEVEL, exclude=angle_matmuls(proto))
    del proto
    external: dict[str, int] = {}
    save_part(quantized, onnx_dir, stem, external)
    log.info("%s: %s (%d-bit MatMulNBits, %d of them)", source, stem, bits,
             sum(n.op_type == "MatMulNBits" for n in quantized.graph.node))
    return external


def quantize_embed_tokens(onnx_dir: Path, stem: str, bits: int) -> dict[str, int]:
    """``embed_tokens.onnx`` with its table in ``bits`` (``GatherBlockQuantized``) as ``onnx_dir/<stem>.onnx``."""
    import onnx

    from edge_runtime.optimize.decoder_quant import DEFAULT_BLOCK_SIZE
    from edge_runtime.optimize.embedding_quant import quantize_embeddings
    from edge_runtime.vlm_parts import save_part

    proto = onnx.load(str(onnx_dir / "embed_tokens.onnx"))
    tables = quantize_embeddings(proto, bits, DEFAULT_BLOCK_SIZE)
    external: dict[str, int] = {}
    save_part(proto, onnx_dir, stem, external)
    log.info("embed_tokens: %s (%s)", stem, f"{bits}-bit GatherBlockQuantized" if tables else
             f"kept float: its width is not a multiple of {DEFAULT_BLOCK_SIZE}")
    return external
