"""Weight-only int4/int8 quantization of a decoder LLM folder (ORT's ``MatMulNBits``).

``quantize_decoder(folder, out, bits)`` writes a copy of an ``optimum``-layout
decoder folder in which every MatMul with a constant weight (q/k/v/o, the MLP,
the LM head) becomes ``MatMulNBits``: the weight stored as blocks of ``bits``-bit
integers with one fp32 scale per block, dequantized inside the kernel. The
conversion is onnxruntime's own ``MatMulNBitsQuantizer`` — the format
onnxruntime-genai's model builder writes — so the folder runs on any ORT build
that has the contrib op. The embedding ``Gather`` stays fp32; activations and
the KV cache keep their dtype, so the generation engine serves the folder as it
is (same inputs, outputs and tokenizer files).

``accuracy_level`` is the kernel's compute type (ORT: 0 = same as the inputs,
4 = int8 activations). Measured here (x86_64 AVX2, 2 threads, a 4-layer
768-wide decoder, greedy decode tokens/s against fp32, best of 3 rounds
interleaved): int4 2.2x at level 0 and 3.6x at level 4; int8 0.2x at level 0
(no fp32 kernel for 8-bit weights) and 2.3x at level 4. Level 4 is what
onnxruntime-genai's builder picks for CPU too, so it is the default.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.errors import InvalidInputError, ModelLoadError

log = logging.getLogger(__name__)

DECODER_MODES = {"int4": 4, "int8": 8}
DEFAULT_BLOCK_SIZE = 32  # ORT's kernels take 16..256 (powers of two); 32 keeps int4 drift small
DEFAULT_ACCURACY_LEVEL = 4  # int8 compute: see the module docstring for the measurement
# ONNX's protobuf limit: a model this large must keep its weights in an external-data file.
_PROTOBUF_LIMIT = 2 * 1024**3 - 1024**2


@dataclass(frozen=True)
class DecoderQuantizeResult:
    """What ``quantize_decoder`` wrote."""

    mode: str
    bits: int
    block_size: int
    accuracy_level: int
    source: Path
    out: Path
    source_bytes: int  # model.onnx and its external data
    out_bytes: int
    matmuls_quantized: int
    matmuls_total: int

    def to_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "bits": self.bits, "block_size": self.block_size,
                "accuracy_level": self.accuracy_level, "source": str(self.source), "out": str(self.out),
                "source_bytes": self.source_bytes, "out_bytes": self.out_bytes,
                "size_ratio": round(self.out_bytes / max(self.source_bytes, 1), 3),
                "matmuls_quantized": self.matmuls_quantized, "matmuls_total": self.matmuls_total}


def _check_block_size(block_size: int) -> None:
    if block_size < 16 or block_size > 256 or block_size & (block_size - 1):
        raise InvalidInputError(f"quantize: block size must be a power of two from 16 to 256, got {block_size}")


def quantize_decoder(folder: Path, out: Path, mode: str, *, block_size: int = DEFAULT_BLOCK_SIZE,
                     accuracy_level: int = DEFAULT_ACCURACY_LEVEL) -> DecoderQuantizeResult:
    """Write ``folder`` with int4/int8 weight-only MatMuls to ``out`` (see the module docstring).

    Raises InvalidInputError (unknown mode, bad block size or accuracy level,
    ``out`` the same folder as ``folder``) and ModelLoadError (not a decoder
    folder, or onnxruntime's quantizer refused the graph, with its message).
    """
    import onnx

    from edge_runtime.generation.folder import read_folder

    if mode not in DECODER_MODES:
        raise InvalidInputError(f"quantize: a decoder folder takes --mode {' or '.join(DECODER_MODES)} "
                                f"(weight-only MatMulNBits), got {mode!r}")
    _check_block_size(block_size)
    if accuracy_level not in (0, 1, 2, 3, 4):
        raise InvalidInputError(f"quantize: accuracy level must be 0..4 (ORT's MatMulNBits), got {accuracy_level}")
    folder, out = Path(folder), Path(out)
    description = read_folder(folder)  # a ModelLoadError naming what is missing when it is not a decoder
    if out.resolve() == folder.resolve():
        raise InvalidInputError(f"quantize: --out must be a new folder, not the source folder {folder}")
    bits = DECODER_MODES[mode]
    proto = onnx.load(str(description.model_path))
    total = sum(1 for node in proto.graph.node if node.op_type == "MatMul")
    try:
        quantized = matmul_nbits(proto, bits, block_size, accuracy_level)
    except Exception as exc:  # the quantizer raises ValueError/AssertionError/onnx errors alike
        raise ModelLoadError(f"quantize {mode}: cannot convert {description.model_path}: "
                             f"{type(exc).__name__}: {exc}") from exc
    done = sum(1 for node in quantized.graph.node if node.op_type == "MatMulNBits")
    if done == 0:
        raise ModelLoadError(f"quantize {mode}: {description.model_path} has no MatMul with a constant 2-D "
                             "weight to quantize")
    _write_folder(folder, out, description.weight_files, quantized)
    written = sum(p.stat().st_size for p in out.iterdir() if p.name.startswith("model.onnx"))
    log.info("quantize %s: %d of %d MatMuls -> MatMulNBits (block %d, accuracy level %d), %d -> %d bytes",
             mode, done, total, block_size, accuracy_level, description.weight_bytes, written)
    return DecoderQuantizeResult(mode, bits, block_size, accuracy_level, folder, out, description.weight_bytes,
                                 written, done, total)


def matmul_nbits(proto: object, bits: int, block_size: int, accuracy_level: int,
                 exclude: list[str] | None = None) -> object:
    """``proto`` (weights loaded) with every MatMul of a constant 2-D weight as ``MatMulNBits``, but the
    nodes named in ``exclude``."""
    # Imported here: the quantizer pulls in onnx_ir and numpy-heavy helpers (seconds, not for the daemon).
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(proto, bits=bits, block_size=block_size, is_symmetric=True,
                                     accuracy_level=accuracy_level, nodes_to_exclude=exclude or [])
    # The quantizer logs every node it visits at INFO; that is noise in a command's output.
    quiet = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    previous = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        quantizer.process()
    finally:
        quiet.setLevel(previous)
    return quantizer.model.model


def _write_folder(folder: Path, out: Path, weight_files: tuple[Path, ...], quantized: object) -> None:
    """Every file of ``folder`` but the model (tokenizer, configs, template), then the quantized model."""
    import onnx

    out.mkdir(parents=True, exist_ok=True)
    skip = {p.name for p in weight_files}
    for entry in folder.iterdir():
        if entry.is_file() and entry.name not in skip:
            shutil.copy2(entry, out / entry.name)
    for stale in out.glob("model.onnx*"):  # a previous run's model and its external data
        stale.unlink()
    large = quantized.ByteSize() > _PROTOBUF_LIMIT  # type: ignore[attr-defined]
    onnx.save(quantized, str(out / "model.onnx"), save_as_external_data=large,
              location="model.onnx.data" if large else None)
