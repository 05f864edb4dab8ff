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
4 = int8 activations). Measured once (x86_64 AVX2, 2 threads, a 4-layer
768-wide decoder, greedy decode tokens/s against fp32, best of 3 rounds
interleaved): int4 2.2x at level 0 and 3.6x at level 4; int8 0.2x at level 0
(no fp32 kernel for 8-bit weights) and 2.3x at level 4. Which wins depends on
the CPU (int8 dot products: VNNI, dotprod, i8mm), so the default is ``auto``:
the weights are quantized once, and each level of ``AUTO_LEVELS`` (the level is
only an attribute of the nodes; the packed weights are the same) runs a few
decode steps of the folder on this machine, one step per level in turn so a
drifting machine slows them alike; the fastest median step wins. The choice and
its timings go into the result and into the folder (``QUANTIZATION_FILE``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.errors import InvalidInputError, ModelLoadError

log = logging.getLogger(__name__)

DECODER_MODES = {"int4": 4, "int8": 8}
DEFAULT_BLOCK_SIZE = 32  # ORT's kernels take 16..256 (powers of two); 32 keeps int4 drift small
DEFAULT_ACCURACY_LEVEL = "auto"  # measured per machine: see the module docstring
# Levels ``auto`` times; each costs a session of the model in memory while timing. Levels 1-3 (fp32,
# fp16, bf16 compute) ran no faster than 0 on an x86 VNNI CPU (31M model, int4: 10.8-11.3 ms a step
# against 11.4 at 0 and 6.6 at 4; int8: 82-87 against 106 and 4.5), so only 0 and 4 are timed.
AUTO_LEVELS = (0, 4)
# A folder written on one machine to run on others (``convert --quantize``) cannot time the target's
# kernels: it takes level 4 (int8 compute), the level ``auto`` chose on every CPU timed here.
CONVERTER_ACCURACY_LEVEL = 4
AUTO_STEPS = 24  # timed decode steps per level (after a warm-up step each)
QUANTIZATION_FILE = "quantization.json"  # written into the folder: what was chosen, and how
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
    # ``auto``: median decode-step milliseconds per timed level (None: the level was given)
    level_step_ms: dict[int, float] | None = None

    def to_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "bits": self.bits, "block_size": self.block_size,
                "accuracy_level": self.accuracy_level,
                "accuracy_level_choice": "given" if self.level_step_ms is None else "auto",
                "level_step_ms": None if self.level_step_ms is None else {
                    str(level): round(ms, 4) for level, ms in self.level_step_ms.items()},
                "source": str(self.source), "out": str(self.out),
                "source_bytes": self.source_bytes, "out_bytes": self.out_bytes,
                "size_ratio": round(self.out_bytes / max(self.source_bytes, 1), 3),
                "matmuls_quantized": self.matmuls_quantized, "matmuls_total": self.matmuls_total}


def _check_block_size(block_size: int) -> None:
    if block_size < 16 or block_size > 256 or block_size & (block_size - 1):
        raise InvalidInputError(f"quantize: block size must be a power of two from 16 to 256, got {block_size}")


def quantize_decoder(folder: Path, out: Path, mode: str, *, block_size: int = DEFAULT_BLOCK_SIZE,
                     accuracy_level: int | str = DEFAULT_ACCURACY_LEVEL, threads: int = 1) -> DecoderQuantizeResult:
    """Write ``folder`` with int4/int8 weight-only MatMuls to ``out`` (see the module docstring).

    ``accuracy_level``: 0..4, or ``"auto"`` to time ``AUTO_LEVELS`` here (decode steps on
    ``threads`` intra-op threads) and keep the fastest. Raises InvalidInputError (unknown mode,
    bad block size or accuracy level, ``out`` the same folder as ``folder``) and ModelLoadError
    (not a decoder folder, or onnxruntime's quantizer refused the graph, with its message).
    """
    import onnx

    from edge_runtime.generation.folder import read_folder

    if mode not in DECODER_MODES:
        raise InvalidInputError(f"quantize: a decoder folder takes --mode {' or '.join(DECODER_MODES)} "
                                f"(weight-only MatMulNBits), got {mode!r}")
    _check_block_size(block_size)
    if accuracy_level != "auto" and (isinstance(accuracy_level, bool) or accuracy_level not in (0, 1, 2, 3, 4)):
        raise InvalidInputError(f"quantize: accuracy level must be 0..4 (ORT's MatMulNBits) or 'auto', "
                                f"got {accuracy_level!r}")
    folder, out = Path(folder), Path(out)
    description = read_folder(folder)  # a ModelLoadError naming what is missing when it is not a decoder
    if out.resolve() == folder.resolve():
        raise InvalidInputError(f"quantize: --out must be a new folder, not the source folder {folder}")
    bits = DECODER_MODES[mode]
    proto = onnx.load(str(description.model_path))
    total = sum(1 for node in proto.graph.node if node.op_type == "MatMul")
    level = AUTO_LEVELS[-1] if accuracy_level == "auto" else int(accuracy_level)
    try:
        quantized = matmul_nbits(proto, bits, block_size, level)
    except Exception as exc:  # the quantizer raises ValueError/AssertionError/onnx errors alike
        raise ModelLoadError(f"quantize {mode}: cannot convert {description.model_path}: "
                             f"{type(exc).__name__}: {exc}") from exc
    done = sum(1 for node in quantized.graph.node if node.op_type == "MatMulNBits")
    if done == 0:
        raise ModelLoadError(f"quantize {mode}: {description.model_path} has no MatMul with a constant 2-D "
                             "weight to quantize")
    _write_folder(folder, out, description.weight_files, quantized)
    step_ms = None
    if accuracy_level == "auto":
        step_ms = time_levels(out, AUTO_LEVELS, threads=threads)
        level = min(step_ms, key=lambda candidate: step_ms[candidate])
        _write_model(out, set_accuracy_level(quantized, level))
    written = sum(p.stat().st_size for p in out.iterdir() if p.name.startswith("model.onnx"))
    log.info("quantize %s: %d of %d MatMuls -> MatMulNBits (block %d, accuracy level %d%s), %d -> %d bytes",
             mode, done, total, block_size, level,
             "" if step_ms is None else ", auto: median step " + ", ".join(f"{ms:.3f} ms at {lv}"
                                                                        for lv, ms in step_ms.items()),
             description.weight_bytes, written)
    result = DecoderQuantizeResult(mode, bits, block_size, level, folder, out, description.weight_bytes,
                                   written, done, total, step_ms)
    record = {k: v for k, v in result.to_dict().items() if k not in ("source", "out")}
    (out / QUANTIZATION_FILE).write_text(json.dumps({**record, "threads": threads if step_ms else None}, indent=2))
    return result


def set_accuracy_level(model: object, level: int) -> object:
    """``model`` with every MatMulNBits node's ``accuracy_level`` set to ``level`` (in place; returned)."""
    import onnx

    for node in model.graph.node:  # type: ignore[attr-defined]
        if node.op_type != "MatMulNBits":
            continue
        kept = [a for a in node.attribute if a.name != "accuracy_level"]
        del node.attribute[:]
        node.attribute.extend([*kept, onnx.helper.make_attribute("accuracy_level", level)])
    return model


def time_levels(folder: Path, levels: tuple[int, ...], *, threads: int = 1,
                steps: int = AUTO_STEPS) -> dict[int, float]:
    """Median decode-step milliseconds of the quantized ``folder`` at each ``levels`` entry.

    Each level is the folder's graph with the attribute changed, loaded by the generation
    engine as a served model would be; the steps alternate level by level, one at a time.
    """
    import onnx

    from edge_runtime.generation.engine import DecoderEngine
    from edge_runtime.generation.folder import read_folder

    description = read_folder(folder)
    engines, times = {}, {level: [] for level in levels}
    with tempfile.TemporaryDirectory(prefix="edge-runtime-levels-") as work:
        for level in levels:
            model = set_accuracy_level(onnx.load(str(description.model_path)), level)
            path = Path(work) / f"level{level}.onnx"
            onnx.save(model, str(path), save_as_external_data=model.ByteSize() > _PROTOBUF_LIMIT,
                      location=f"level{level}.onnx.data")
            engines[level] = DecoderEngine(dataclasses.replace(description, model_path=path), threads=threads,
                                           max_batch=1, max_len=steps + 16)
        prompt = [1 + i % max(description.vocab_size - 1, 1) for i in range(8)]
        tokens = {}
        for level, engine in engines.items():
            logits, past = engine.prefill(prompt, None)
            engine.kv.rebuild([], [past])
            tokens[level] = int(logits.argmax())
            engine.decode([tokens[level]])  # warm-up: the first step allocates and pre-packs
        for _ in range(steps):
            for level, engine in engines.items():
                started = time.perf_counter()
                logits = engine.decode([tokens[level]])
                times[level].append((time.perf_counter() - started) * 1e3)
                tokens[level] = int(logits[0].argmax())
    return {level: float(sorted(values)[len(values) // 2]) for level, values in times.items()}


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
    out.mkdir(parents=True, exist_ok=True)
    skip = {p.name for p in weight_files}
    for entry in folder.iterdir():
        if entry.is_file() and entry.name not in skip:
            shutil.copy2(entry, out / entry.name)
    _write_model(out, quantized)


def _write_model(out: Path, model: object) -> None:
    import onnx

    for stale in out.glob("model.onnx*"):  # a previous model and its external data
        stale.unlink()
    large = model.ByteSize() > _PROTOBUF_LIMIT  # type: ignore[attr-defined]
    onnx.save(model, str(out / "model.onnx"), save_as_external_data=large,
              location="model.onnx.data" if large else None)
