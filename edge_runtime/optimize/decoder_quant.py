"""int4/int8 quantization of a decoder LLM folder's weights (ORT's ``MatMulNBits``, or int8 ``MatMulInteger``).

``quantize_decoder(folder, out, bits)`` writes a copy of an ``optimum``-layout
decoder folder in which every MatMul with a constant weight (q/k/v/o, the MLP,
the LM head) becomes ``MatMulNBits`` (int8: or the ``MatMulInteger`` form below):
the weight stored as blocks of ``bits``-bit integers with one fp32 scale per
block, dequantized inside the kernel. The
conversion is onnxruntime's own ``MatMulNBitsQuantizer`` — the format
onnxruntime-genai's model builder writes — so the folder runs on any ORT build
that has the contrib op. The token-embedding table is stored in the same bits and
blocks (``embedding_quant``: ``GatherBlockQuantized``; ``embeddings=False`` keeps it
float); activations and the KV cache keep their dtype, so the generation engine
serves the folder as it is (same inputs, outputs and tokenizer files).

``accuracy_level`` is the kernel's compute type (ORT: 0 = same as the inputs,
4 = int8 activations). Measured once (x86_64 AVX2, 2 threads, a 4-layer
768-wide decoder, greedy decode tokens/s against fp32, best of 3 rounds
interleaved): int4 2.2x at level 0 and 3.6x at level 4; int8 0.2x at level 0
(no fp32 kernel for 8-bit weights) and 2.3x at level 4.

int8 has a second form: ``per_token_int8`` (int8 weights per output column,
activations quantized per token at run time, ``MatMulInteger``). ``MatMulNBits``
makes a pass over its weights per row, the integer GEMM one per step, so a batch of
rows favours the integer form; alone, either can win (on an Intel Xeon with VNNI, 2 threads: a
31M decoder ran level with ``MatMulNBits`` alone and 1.4x as fast at eight streams;
a 0.5B-shaped one 1.2x alone, 1.9x at eight, and prefilled 1,024 tokens 2.8x as fast).

Which wins depends on the CPU (int8 dot products: VNNI, dotprod, i8mm), so the
default is ``auto``: the weights are quantized once per form, and each candidate
of ``AUTO_KERNELS`` runs decode steps of the folder on this machine, of one row
and of eight (``AUTO_ROWS``), one step per candidate in turn so a drifting machine
slows them alike; among the candidates whose drift from the original (mean KL per
token, teacher-forced on the calibration text) is within ``PRECISION_SLACK`` of the
smallest, the one whose worst ratio to the fastest is smallest wins. The choice,
its timings and drifts go into the result and into the folder (``QUANTIZATION_FILE``).
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

from typing import Any

from edge_runtime.errors import InvalidInputError, ModelLoadError
from edge_runtime.optimize.per_token_int8 import per_token_int8
from edge_runtime.optimize.quantize import Int8Settings, host_int8_settings

log = logging.getLogger(__name__)

DECODER_MODES = {"int4": 4, "int8": 8}
DEFAULT_BLOCK_SIZE = 32  # ORT's kernels take 16..256 (powers of two); 32 keeps int4 drift small
DEFAULT_ACCURACY_LEVEL = "auto"  # measured per machine: see the module docstring
NBITS, INTEGER = "MatMulNBits", "MatMulInteger"
KERNELS = ("auto", "matmulnbits", "matmulinteger")  # ``--kernel``


@dataclass(frozen=True)
class Kernel:
    """One way to run the quantized MatMuls: ``MatMulNBits`` at an accuracy level, or the per-token
    int8 ``MatMulInteger`` form (``per_token_int8``)."""

    op: str
    level: int | None = None  # MatMulNBits' accuracy_level

    @property
    def name(self) -> str:
        return self.op if self.level is None else f"{self.op} level {self.level}"


# Levels ``--kernel matmulnbits`` times; each costs a session of the model in memory while timing. Levels
# 1-3 (fp32, fp16, bf16 compute) ran no faster than 0 on an x86 VNNI CPU (31M model, int4: 10.8-11.3 ms a
# step against 11.4 at 0 and 6.6 at 4; int8: 82-87 against 106 and 4.5), so only 0 and 4 are timed.
AUTO_LEVELS = (0, 4)
# What ``auto`` times per mode. int8 does not time MatMulNBits level 0: 8-bit weights have no fp32 kernel,
# 20-35x slower than level 4 wherever timed (a 31M decoder 77 vs 3.7 ms a step, a 0.5B-shaped one 1,339 vs
# 38 on an Intel Xeon); it times level 4 against the per-token MatMulInteger form instead.
AUTO_KERNELS = {"int4": (Kernel(NBITS, 0), Kernel(NBITS, 4)), "int8": (Kernel(NBITS, 4), Kernel(INTEGER))}
# Decode rows a timed step carries: one stream, and a continuous batch of eight. MatMulNBits reads its
# weights once per row, the integer GEMM once per step, so the order of the kernels can flip between them.
AUTO_ROWS = (1, 8)
# A folder written on one machine to run on others (``convert --quantize``) cannot time the target's
# kernels: it takes level 4 (int8 compute), the level ``auto`` chose on every CPU timed here.
CONVERTER_ACCURACY_LEVEL = 4
AUTO_STEPS = 24  # timed decode steps per kernel and row count (after a warm-up step each)
# ``auto`` only weighs the speed of candidates whose drift from the original stays near the most precise
# one's: mean KL(original || candidate) per token, teacher-forced on the calibration text, at most this
# many times the smallest (a choice). On the random test decoders the per-token int8 form drifted 1.7-2.4x
# MatMulNBits int8, and int4 ~60x int8; a model whose activations have outlier channels (real LLMs often
# do) makes per-token scales coarser still, and then MatMulNBits' per-block scales are kept.
PRECISION_SLACK = 4.0
PRECISION_WINDOW, PRECISION_TOKENS = 256, 512  # teacher-forced windows of the text for that check
QUANTIZATION_FILE = "quantization.json"  # written into the folder: what was chosen, and how
# ONNX's protobuf limit: a model this large must keep its weights in an external-data file.
_PROTOBUF_LIMIT = 2 * 1024**3 - 1024**2


@dataclass(frozen=True)
class DecoderQuantizeResult:
    """What ``quantize_decoder`` wrote."""

    mode: str
    bits: int
    block_size: int | None  # MatMulNBits' block; None for MatMulInteger (one scale per output column)
    kernel: str  # NBITS or INTEGER
    accuracy_level: int | None  # MatMulNBits' level; None for MatMulInteger
    source: Path
    out: Path
    source_bytes: int  # model.onnx and its external data
    out_bytes: int
    matmuls_quantized: int
    matmuls_total: int
    # ``auto``: median decode-step milliseconds per timed kernel and rows a step (None: the kernel was given)
    step_ms: dict[str, dict[int, float]] | None = None
    # ``auto``: each timed kernel's mean KL(original || it) per token on the calibration text
    kl_mean: dict[str, float] | None = None
    embeddings_quantized: tuple[str, ...] = ()  # token-embedding tables stored in ``bits`` (embedding_quant)

    def to_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "bits": self.bits, "block_size": self.block_size, "kernel": self.kernel,
                "accuracy_level": self.accuracy_level,
                "kernel_choice": "given" if self.step_ms is None else "auto",
                "step_ms": None if self.step_ms is None else {
                    name: {str(rows): round(ms, 4) for rows, ms in by_rows.items()}
                    for name, by_rows in self.step_ms.items()},
                "kl_mean": None if self.kl_mean is None else {name: float(f"{kl:.4g}")
                                                              for name, kl in self.kl_mean.items()},
                "source": str(self.source), "out": str(self.out),
                "source_bytes": self.source_bytes, "out_bytes": self.out_bytes,
                "size_ratio": round(self.out_bytes / max(self.source_bytes, 1), 3),
                "matmuls_quantized": self.matmuls_quantized, "matmuls_total": self.matmuls_total,
                "embeddings_quantized": list(self.embeddings_quantized)}


def _check_block_size(block_size: int) -> None:
    if block_size < 16 or block_size > 256 or block_size & (block_size - 1):
        raise InvalidInputError(f"quantize: block size must be a power of two from 16 to 256, got {block_size}")


def _candidates(mode: str, kernel: str, accuracy_level: int | str,
                int8: Int8Settings) -> tuple[tuple[Kernel, ...], bool]:
    """The kernels to build (and time, when more than one) for these arguments, and whether they are timed."""
    if kernel not in KERNELS:
        raise InvalidInputError(f"quantize: --kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if accuracy_level != "auto" and (isinstance(accuracy_level, bool) or accuracy_level not in (0, 1, 2, 3, 4)):
        raise InvalidInputError(f"quantize: accuracy level must be 0..4 (ORT's MatMulNBits) or 'auto', "
                                f"got {accuracy_level!r}")
    if kernel == "matmulinteger":
        if mode != "int8":
            raise InvalidInputError(f"quantize: --kernel matmulinteger takes --mode int8 (int4 weights need "
                                    f"MatMulNBits), got --mode {mode}")
        if accuracy_level != "auto":
            raise InvalidInputError(f"quantize: --accuracy-level is MatMulNBits' setting; --kernel matmulinteger "
                                    f"takes none, got {accuracy_level!r}")
        return (Kernel(INTEGER),), False
    if accuracy_level != "auto":
        return (Kernel(NBITS, int(accuracy_level)),), False
    if kernel == "matmulnbits":
        return tuple(Kernel(NBITS, level) for level in AUTO_LEVELS), True
    candidates = AUTO_KERNELS[mode]
    if int8.reduce_range:  # x86 without VNNI: 7-bit integer weights, a precision loss ``auto`` does not choose
        candidates = tuple(k for k in candidates if k.op != INTEGER)
    return candidates, len(candidates) > 1


def quantize_decoder(folder: Path, out: Path, mode: str, *, block_size: int = DEFAULT_BLOCK_SIZE,
                     accuracy_level: int | str = DEFAULT_ACCURACY_LEVEL, kernel: str = "auto", threads: int = 1,
                     int8: Int8Settings | None = None, text: str | None = None,
                     cache_dir: Path | None = None, embeddings: bool = True) -> DecoderQuantizeResult:
    """Write ``folder`` with int4/int8 weight-only MatMuls to ``out`` (see the module docstring).

    ``kernel``: ``matmulnbits``, ``matmulinteger`` (int8 only: ``per_token_int8``) or ``auto``;
    ``accuracy_level``: MatMulNBits' 0..4, or ``"auto"``. What is not given is timed here (decode
    steps of one and eight rows on ``threads`` intra-op threads) and the fastest kept. ``int8``: the
    integer types for this CPU (default: ``host_int8_settings()``); ``text``: the calibration text of the
    precision check (default: ``decoder_drift.DEFAULT_TEXT``); ``embeddings``: store the token-embedding
    table in ``bits`` too (``embedding_quant``; every candidate alike). An ``optimum`` export is quantized as
    the engine would run it: rebuilt as the fused graph where it can be (``generation.fused_exports``,
    kept in ``cache_dir``, default the runtime's), so the folder written is the fused graph quantized.
    Raises InvalidInputError (unknown
    mode or kernel, bad block size or accuracy level, ``out`` the same folder as ``folder``) and
    ModelLoadError (not a decoder folder, or onnxruntime's quantizer refused the graph, with its message).
    """
    from edge_runtime.generation.fused_exports import text_decoder
    from edge_runtime.generation.settings import GenerationSettings

    if mode not in DECODER_MODES:
        raise InvalidInputError(f"quantize: a decoder folder takes --mode {' or '.join(DECODER_MODES)} "
                                f"(weight-only MatMulNBits), got {mode!r}")
    _check_block_size(block_size)
    int8 = host_int8_settings() if int8 is None else int8
    candidates, timed = _candidates(mode, kernel, accuracy_level, int8)
    folder, out = Path(folder), Path(out)
    if out.resolve() == folder.resolve():
        raise InvalidInputError(f"quantize: --out must be a new folder, not the source folder {folder}")
    # a ModelLoadError naming what is missing when it is not a decoder
    description, why = text_decoder(folder, GenerationSettings(), cache_dir)
    log.info("quantize %s: the source graph: %s", folder, why)
    bits = DECODER_MODES[mode]
    models: dict[str, Any] = {}
    total = 0
    for op in dict.fromkeys(k.op for k in candidates):  # one conversion per op; levels share the weights
        level = next(k.level for k in candidates if k.op == op)
        model, total, tables = _convert(description.model_path, mode, op, bits, block_size, level, int8, embeddings)
        for candidate in candidates:
            if candidate.op == op:  # each level written out: the quantizer leaves a default level unset
                models[candidate.name] = model if candidate.level is None else \
                    set_accuracy_level(model if candidate.level == level else _copy(model), candidate.level)
    step_ms = kl = None
    if timed:
        step_ms, kl = measure_kernels(description, models, threads=threads, text=text)
    chosen = candidates[0] if step_ms is None else next(k for k in candidates if k.name == fastest(step_ms, kl))
    winner = models[chosen.name]
    done = sum(1 for node in winner.graph.node if node.op_type == chosen.op)
    _write_folder(folder, out, description.weight_files, winner)
    written = sum(p.stat().st_size for p in out.iterdir() if p.name.startswith("model.onnx"))
    log.info("quantize %s: %d of %d MatMuls -> %s%s, %d -> %d bytes", mode, done, total, chosen.name,
             "" if step_ms is None else ", auto: median step ms " + "; ".join(
                 f"{name} " + ", ".join(f"{ms:.3f} at {rows} rows" for rows, ms in by_rows.items())
                 for name, by_rows in step_ms.items()),
             description.weight_bytes, written)
    result = DecoderQuantizeResult(mode, bits, block_size if chosen.op == NBITS else None, chosen.op, chosen.level,
                                   folder, out, description.weight_bytes, written, done, total, step_ms, kl,
                                   tuple(tables))
    record = {k: v for k, v in result.to_dict().items() if k not in ("source", "out")}
    (out / QUANTIZATION_FILE).write_text(json.dumps({**record, "threads": threads if step_ms else None,
                                                     "int8": int8.why if chosen.op == INTEGER else None},
                                                    indent=2))
    return result


def _convert(path: Path, mode: str, op: str, bits: int, block_size: int, level: int | None,
             int8: Int8Settings, embeddings: bool) -> tuple[Any, int, list[str]]:
    """The model at ``path`` with its MatMuls as ``op`` (and, with ``embeddings``, its token-embedding
    table in ``bits``), how many MatMuls it had, and the embedding tables quantized."""
    import onnx

    from edge_runtime.optimize.embedding_quant import quantize_embeddings, share_tied_table

    proto = onnx.load(str(path))
    total = sum(1 for node in proto.graph.node if node.op_type == "MatMul")
    try:
        if op == NBITS:
            converted = matmul_nbits(proto, bits, block_size, level)
            done = sum(1 for node in converted.graph.node if node.op_type == NBITS)
        else:
            converted, done = per_token_int8(proto, int8)
    except Exception as exc:  # the quantizer raises ValueError/AssertionError/onnx errors alike
        raise ModelLoadError(f"quantize {mode}: cannot convert {path}: {type(exc).__name__}: {exc}") from exc
    if done == 0:
        raise ModelLoadError(f"quantize {mode}: {path} has no MatMul with a constant 2-D weight to quantize")
    tables = quantize_embeddings(converted, bits, block_size) if embeddings else []
    if tables and op == NBITS:
        shared = share_tied_table(converted)
        log.info("quantize %s: embedding %s quantized%s", mode, tables,
                 f"; it reads the tied head's integers ({shared})" if shared else "")
    return converted, total, tables


def _copy(model: Any) -> Any:
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def fastest(step_ms: dict[str, dict[int, float]], kl_mean: dict[str, float] | None = None) -> str:
    """Among the kernels whose mean KL is within ``PRECISION_SLACK`` of the smallest (all, without
    ``kl_mean``), the one whose worst ratio to the fastest at any timed row count is the smallest: the
    one that never loses much, where one kernel can win alone and another in a batch."""
    eligible = list(step_ms)
    if kl_mean:
        floor = min(kl_mean.values())
        eligible = [name for name in step_ms if kl_mean[name] <= PRECISION_SLACK * floor] or eligible
    rows = {r for name in eligible for r in step_ms[name]}
    best = {r: min(step_ms[name][r] for name in eligible) for r in rows}
    return min(eligible, key=lambda name: max(step_ms[name][r] / best[r] for r in rows))


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


def measure_kernels(description: Any, models: dict[str, Any], *, threads: int = 1, steps: int = AUTO_STEPS,
                    rows: tuple[int, ...] = AUTO_ROWS,
                    text: str | None = None) -> tuple[dict[str, dict[int, float]], dict[str, float]]:
    """Median decode-step milliseconds of each of ``models`` (the folder's graph, converted) at each ``rows``,
    and each one's mean KL(original || it) per token teacher-forced on ``text`` (``kernel_drift``).

    Each is loaded by the generation engine as a served model would be; at each row count the steps
    alternate model by model, one at a time, so a drifting machine slows them alike.
    """
    import onnx

    from edge_runtime.generation.engine import DecoderEngine

    engines, times = {}, {name: {r: [] for r in rows} for name in models}
    with tempfile.TemporaryDirectory(prefix="edge-runtime-kernels-") as work:
        for index, (name, model) in enumerate(models.items()):
            path = Path(work) / f"kernel{index}.onnx"
            large = model.ByteSize() > _PROTOBUF_LIMIT
            # NOTE: saving with external data moves the weights out of the proto saved; the chosen one is
            # written to the folder afterwards, so a large candidate is saved from a copy.
            onnx.save(_copy(model) if large else model, str(path), save_as_external_data=large,
                      location=f"kernel{index}.onnx.data")
            engines[name] = DecoderEngine(dataclasses.replace(description, model_path=path), threads=threads,
                                          max_batch=max(rows), max_len=steps + 16)
        kl = kernel_drift(description, {name: engine.folder.model_path for name, engine in engines.items()},
                          text, threads=threads)
        for count in rows:
            prompts = [[1 + (i + 7 * row) % max(description.vocab_size - 1, 1) for i in range(8)]
                       for row in range(count)]
            tokens = {}
            for name, engine in engines.items():
                pasts, firsts = [], []
                for prompt in prompts:
                    logits, past = engine.prefill(prompt, None)
                    pasts.append(past)
                    firsts.append(int(logits.argmax()))
                engine.kv.rebuild([], pasts)
                logits = engine.decode(firsts)  # warm-up: the first step allocates and pre-packs
                tokens[name] = [int(row.argmax()) for row in logits]
            for _ in range(steps):
                for name, engine in engines.items():
                    started = time.perf_counter()
                    logits = engine.decode(tokens[name])
                    times[name][count].append((time.perf_counter() - started) * 1e3)
                    tokens[name] = [int(row.argmax()) for row in logits]
    return ({name: {r: float(sorted(v)[len(v) // 2]) for r, v in by_rows.items()} for name, by_rows in times.items()},
            kl)


def kernel_drift(description: Any, paths: dict[str, Path], text: str | None, *, threads: int = 1) -> dict[str, float]:
    """Mean KL(original || candidate) per token of each graph in ``paths`` (the folder's graph, converted),
    teacher-forced over ``text``'s first ``PRECISION_TOKENS`` tokens in windows of ``PRECISION_WINDOW``."""
    import numpy as np

    from edge_runtime.optimize.decoder_drift import (DEFAULT_TEXT, graph_session, kl_per_position, log_softmax,
                                                     token_windows, window_logits)

    windows = token_windows(description.path, DEFAULT_TEXT if text is None else text,
                            min(PRECISION_WINDOW, description.context_length), PRECISION_TOKENS)

    def log_probs(path: Path) -> list[np.ndarray]:
        session = graph_session(description, path, threads)
        return [log_softmax(window_logits(description, session, window)) for window in windows]

    reference = log_probs(description.model_path)
    return {name: float(np.concatenate([kl_per_position(ref, cand)
                                        for ref, cand in zip(reference, log_probs(path))]).mean())
            for name, path in paths.items()}


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
    # Weights always in ``model.onnx.data``, not inside the protobuf (past 2 GiB it must be so anyway):
    # ONNX Runtime maps an external-data file into memory, and the kernels that pre-pack their weights
    # (MatMulNBits, MatMulInteger) keep only their packed copies, so the originals stay clean file-backed
    # pages the kernel can drop, where weights inside the protobuf are copied to the heap. Measured on
    # Qwen2.5-0.5B's shape at its 151,936-token vocabulary, int4, a bare session: 636 MiB resident
    # (603 anonymous) inside the protobuf against 488 (395) beside it.
    onnx.save(model, str(out / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
