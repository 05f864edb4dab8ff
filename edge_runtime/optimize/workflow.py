"""``convert``: quantize a model, then report its drift against fp32 and its speed on each plan.

The one function the ``quantize`` command and the benchmarks call. Both
models are loaded through the ``Runtime`` (so "each plan" means what ``run
--plan`` means); the accuracy oracle is the fp32 model on the ``cpu`` plan,
which is plain ONNX Runtime.
"""

from __future__ import annotations

import dataclasses
import logging
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from edge_runtime.errors import EdgeRuntimeError, ModelLoadError
from edge_runtime.optimize.calibration import Sample, load_samples, seeded_samples
from edge_runtime.optimize.quantize import QuantizeResult, int8_settings, quantize_model
from edge_runtime.optimize.report import OutputDrift, PlanSpeed, accuracy_report, speed_report

if TYPE_CHECKING:
    from edge_runtime.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConversionReport:
    """The conversion, its drift per output (on the ``cpu`` plan) and per-plan speed."""

    result: QuantizeResult
    samples_from: str  # the calibration folder, or "seeded"
    drift: tuple[OutputDrift, ...]
    speed: tuple[PlanSpeed, ...]
    plan_errors: tuple[tuple[str, str], ...] = ()  # plans that could not load the converted model

    def to_dict(self) -> dict[str, Any]:
        return {**self.result.to_dict(), "samples_from": self.samples_from,
                "accuracy": [d.to_dict() for d in self.drift], "speed": [s.to_dict() for s in self.speed],
                "plan_errors": [{"plan": p, "error": e} for p, e in self.plan_errors]}


def convert(runtime: "Runtime", source: Path, out: Path, mode: str, *, calibration: Path | None = None,
            plans: Sequence[str] | None = None, seeded_count: int = 16, rounds: int = 5, runs_per_round: int = 10,
            on_sample: Callable[[], None] | None = None, on_total: Callable[[int], None] | None = None) -> ConversionReport:
    """Quantize ``source`` to ``out`` and report (see module docstring).

    ``plans`` default: every plan this device has. ``on_total`` is told how
    many calibration samples follow, ``on_sample`` is called per sample read.
    Raises what ``quantize_model`` and ``Runtime.load`` raise.
    """
    from backends.onnx_graph import graph_inputs, load_onnx

    specs = graph_inputs(load_onnx(source))
    samples: list[Sample] = load_samples(calibration, specs) if calibration else seeded_samples(specs, seeded_count)
    if on_total is not None and mode == "static":
        on_total(len(samples))
    settings = runtime_int8_settings(runtime)
    result = quantize_model(source, out, mode, settings=settings, samples=samples, on_sample=on_sample)
    # The drift is measured on `cpu` (plain ONNX Runtime), so it is always among the plans.
    names = ["cpu", *[p for p in (plans or _available_plans(runtime, source)) if p != "cpu"]]
    pairs: dict[str, tuple[Any, Any]] = {}
    errors: list[tuple[str, str]] = []
    # NOTE: both models live in one process and take turns: ONNX Runtime's spinning worker threads
    # (its default) of the idle one then steal cores from the other (measured here, 2 cores: ResNet fp32
    # 5-6 ms beside a spinning int8 session, 3.4 ms alone), which inflates the speed-up. Non-spinning
    # sessions, as the daemon serves them, time each model as if alone.
    options = dataclasses.replace(runtime.compile_options(), allow_spinning=False)
    loaded = []
    try:
        for plan in names:
            reference = runtime.load(source, plan=plan, options=options)
            loaded.append(reference)
            try:
                candidate = runtime.load(out, plan=plan, options=options)
            except EdgeRuntimeError as exc:  # reported per plan; the other plans still run
                log.warning("quantize: plan %s cannot load %s: %s", plan, out, exc)
                errors.append((plan, f"{type(exc).__name__}: {exc}"))
                continue
            loaded.append(candidate)
            pairs[plan] = (reference.run, candidate.run)
        if "cpu" not in pairs:
            raise ModelLoadError(f"quantize: the converted model does not load on plan 'cpu': {errors[0][1]}")
        drift = accuracy_report(*pairs["cpu"], samples)
        speed = speed_report(pairs, samples[0], rounds, runs_per_round)
    finally:
        for model in loaded:
            model.close()
    return ConversionReport(result, str(calibration) if calibration else "seeded", tuple(drift), tuple(speed),
                            tuple(errors))


def _available_plans(runtime: "Runtime", source: Path) -> list[str]:
    """``cpu``, plus the accelerator plans where one is usable."""
    if runtime.accelerator() is None:
        return ["cpu"]
    return list(runtime.planner(source).available())


@dataclass(frozen=True)
class DecoderConversionReport:
    """A decoder folder's weight-only quantization, its drift on the calibration text and its decode speed."""

    result: Any  # DecoderQuantizeResult
    text_from: str  # the calibration file or folder, or "default"
    drift: Any  # DecoderDrift
    speed: Any  # DecodeSpeed

    def to_dict(self) -> dict[str, Any]:
        return {**self.result.to_dict(), "text_from": self.text_from, "drift": self.drift.to_dict(),
                "speed": self.speed.to_dict()}


def runtime_int8_settings(runtime: "Runtime") -> Any:
    """``int8_settings`` for the CPU the runtime's device profile describes."""
    cpu = runtime.profile.get("cpu", {})
    return int8_settings(cpu.get("features", []), platform.machine())


def convert_decoder(runtime: "Runtime", folder: Path, out: Path, mode: str, *, calibration: Path | None = None,
                    block_size: int | None = None, accuracy_level: int | str | None = None, kernel: str = "auto",
                    embeddings: bool = True, rounds: int = 3,
                    new_tokens: int = 32, window: int = 256) -> DecoderConversionReport:
    """int4/int8 weight-only copy of a decoder folder, then its teacher-forced drift and decode speed
    against the original (``edge_runtime.optimize.decoder_quant`` and ``decoder_drift``)."""
    from edge_runtime.errors import InvalidInputError
    from edge_runtime.generation.folder import read_folder
    from edge_runtime.optimize.decoder_drift import (calibration_text, compare_decode_speed, decoder_drift,
                                                     token_windows)
    from edge_runtime.optimize.decoder_quant import DEFAULT_ACCURACY_LEVEL, DEFAULT_BLOCK_SIZE, quantize_decoder

    text, text_from = calibration_text(calibration)  # read first: a bad file fails before minutes of work
    context = read_folder(folder).context_length
    if not 2 <= new_tokens < context - 1:
        raise InvalidInputError(f"--new-tokens must be from 2 to {context - 2} (this model's context is {context} "
                                f"tokens), got {new_tokens}")
    # The timed prompt: the text's first tokens, short enough to leave the new tokens room.
    prompt = token_windows(folder, text, min(64, context - new_tokens - 1), 64)[0]
    result = quantize_decoder(folder, out, mode,
                              block_size=DEFAULT_BLOCK_SIZE if block_size is None else block_size,
                              accuracy_level=DEFAULT_ACCURACY_LEVEL if accuracy_level is None else accuracy_level,
                              kernel=kernel, embeddings=embeddings, text=text, int8=runtime_int8_settings(runtime),
                              threads=runtime.threads, cache_dir=runtime.config.cache_dir)
    drift = decoder_drift(folder, out, text, window=window, threads=runtime.threads)
    speed = compare_decode_speed(runtime, folder, out, prompt=prompt, new_tokens=new_tokens, rounds=rounds)
    return DecoderConversionReport(result, text_from, drift, speed)
