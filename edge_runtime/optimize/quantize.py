"""Convert an fp32 ONNX model to int8 (dynamic or static QDQ) or fp16, with maintained converters.

* ``dynamic``: ``onnxruntime.quantization.quantize_dynamic`` — int8 weights,
  activations quantized at run time (``DynamicQuantizeLinear`` +
  ``MatMulInteger``/``ConvInteger``). No calibration data needed.
* ``static``: ``quantize_static`` in QDQ format — activation ranges come from
  calibration samples (a folder of ``.npy``/``.npz``, else seeded inputs).
* ``fp16``: ``onnxruntime.transformers.float16`` (ships with onnxruntime),
  graph inputs/outputs kept fp32 so callers feed the same arrays.

The quantization types follow ORT's CPU guidance for the ISA the device
profile reports (see ``int8_settings``).
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from edge_runtime.errors import InvalidInputError, ModelLoadError
from edge_runtime.optimize.calibration import Sample, SampleReader

log = logging.getLogger(__name__)

MODES = ("dynamic", "static", "fp16")


@dataclass(frozen=True)
class Int8Settings:
    """Activation/weight int8 types and range reduction (ORT's CPU guidance)."""

    activation_signed: bool
    reduce_range: bool
    per_channel: bool = False  # ORT: per-tensor weights give the best CPU throughput
    why: str = ""


def int8_settings(cpu_features: Sequence[str], machine: str) -> Int8Settings:
    """Settings for this CPU: ARM takes signed int8 activations; x86 without VNNI reduces weights to 7 bits.

    ORT's guidance: on x86 without VNNI, u8 activations x s8 weights can saturate the
    16-bit intermediate of ``pmaddubsw``; ``reduce_range`` avoids it.
    """
    features = {f.lower() for f in cpu_features}
    if machine.lower() in ("aarch64", "arm64") or machine.lower().startswith("arm"):
        return Int8Settings(activation_signed=True, reduce_range=False, why="ARM: symmetric s8 activations")
    if features & {"avx512_vnni", "avx_vnni", "avx512vnni"}:
        return Int8Settings(activation_signed=False, reduce_range=False, why="x86 with VNNI: u8 x s8")
    return Int8Settings(activation_signed=False, reduce_range=True, why="x86 without VNNI: u8 x s8, 7-bit weights")


def host_int8_settings() -> Int8Settings:
    """``int8_settings`` for the CPU this process runs on (the device probe's ISA features)."""
    import platform

    from device_profiles.cpu import read_cpu

    facts, _ = read_cpu("/", {})
    return int8_settings(facts.get("features", []), platform.machine())


@dataclass(frozen=True)
class QuantizeResult:
    """What ``quantize_model`` wrote."""

    mode: str
    source: Path
    out: Path
    source_bytes: int
    out_bytes: int
    settings: Int8Settings | None
    calibration_samples: int

    def to_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "source": str(self.source), "out": str(self.out),
                "source_bytes": self.source_bytes, "out_bytes": self.out_bytes,
                "size_ratio": round(self.out_bytes / max(self.source_bytes, 1), 3),
                "settings": None if self.settings is None else {
                    "activation": "int8" if self.settings.activation_signed else "uint8",
                    "weight": "int8", "reduce_range": self.settings.reduce_range,
                    "per_channel": self.settings.per_channel, "why": self.settings.why},
                "calibration_samples": self.calibration_samples}


def quantize_model(source: Path, out: Path, mode: str, *, settings: Int8Settings,
                   samples: Sequence[Sample] = (), on_sample: Callable[[], None] | None = None) -> QuantizeResult:
    """Write ``source`` converted by ``mode`` to ``out``.

    ``samples`` are the calibration inputs of ``static`` (required there);
    ``on_sample`` is called once per calibration sample read (a progress bar).
    Raises InvalidInputError (unknown mode, static without samples) and
    ModelLoadError (the converter refused the model, with its message).
    """
    source, out = Path(source), Path(out)
    if mode not in MODES:
        raise InvalidInputError(f"quantize: unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if mode == "static" and not samples:
        raise InvalidInputError("quantize: mode 'static' needs calibration samples")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        if mode == "fp16":
            _to_fp16(source, out)
        else:
            _to_int8(source, out, mode, settings, samples, on_sample)
    except (InvalidInputError, ModelLoadError):
        raise
    except Exception as exc:  # the converters raise ValueError/RuntimeError/onnx errors alike
        raise ModelLoadError(f"quantize {mode}: cannot convert {source}: {type(exc).__name__}: {exc}") from exc
    return QuantizeResult(mode, source, out, source.stat().st_size, out.stat().st_size,
                          None if mode == "fp16" else settings, len(samples) if mode == "static" else 0)


def _to_int8(source: Path, out: Path, mode: str, settings: Int8Settings, samples: Sequence[Sample],
             on_sample: Callable[[], None] | None) -> None:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory(prefix="edge-runtime-quant-") as tmp:
        # ORT recommends shape inference + graph optimisation (BatchNorm folded into Conv)
        # before quantizing, so the quantizer sees the graph ORT will run.
        prepared = _pre_process(source, Path(tmp) / "prepared.onnx", quant_pre_process)
        if mode == "dynamic":
            # Dynamic activations are always u8 in ORT's integer kernels (ConvInteger/MatMulInteger).
            quantize_dynamic(str(prepared), str(out), weight_type=QuantType.QInt8,
                             per_channel=settings.per_channel, reduce_range=settings.reduce_range)
            return
        activation = QuantType.QInt8 if settings.activation_signed else QuantType.QUInt8
        quantize_static(str(prepared), str(out), SampleReader(samples, on_sample), quant_format=QuantFormat.QDQ,
                        per_channel=settings.per_channel, reduce_range=settings.reduce_range,
                        activation_type=activation, weight_type=QuantType.QInt8)


def _pre_process(source: Path, prepared: Path, quant_pre_process: Callable[..., None]) -> Path:
    """ORT's pre-processing; without its symbolic shape inference where that fails (it asserts on
    some exported graphs, e.g. a Concat it cannot follow), else the model as it is."""
    for skip_symbolic in (False, True):
        try:
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=skip_symbolic)
            return prepared
        except Exception as exc:  # ORT's shape inference raises AssertionError, ValueError, onnx errors
            log.warning("quantize: pre-processing %s (symbolic shapes %s) failed: %s: %s", source,
                        "off" if skip_symbolic else "on", type(exc).__name__, exc)
    return source


def _to_fp16(source: Path, out: Path) -> None:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(source))
    converted = convert_float_to_float16(model, keep_io_types=True)
    onnx.save(converted, str(out))
