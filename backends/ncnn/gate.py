"""The correctness gate: one seeded run of a converted model against ONNX Runtime.

A conversion that disagrees with ONNX Runtime beyond the precision's
tolerance is refused with the numbers; it never serves. The error measure is
``max |ncnn - ort| / max(1, max |ort|)`` per output: absolute for outputs of
order one (probabilities), relative to the output's scale for larger ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from backends.errors import ModelLoadError

TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2}


class ConversionRefusedError(ModelLoadError):
    """The converted model's outputs differ from ONNX Runtime's beyond the tolerance."""


@dataclass(frozen=True)
class GateResult:
    """Worst error per output name, the tolerance it was held to, and ORT's per-sample output shapes."""

    errors: dict[str, float]
    tolerance: float
    output_shapes: tuple[tuple[int, ...], ...]

    @property
    def worst(self) -> float:
        return max(self.errors.values(), default=0.0)


def seeded_samples(shapes: Sequence[Sequence[int]], seed: int = 0) -> list[np.ndarray]:
    """Uniform [0, 1) float32 inputs of ``shapes`` (batch axis included), the same on every machine."""
    rng = np.random.default_rng(seed)
    return [rng.random(tuple(s), dtype=np.float32) for s in shapes]


def output_error(got: np.ndarray, want: np.ndarray) -> float:
    if got.shape != want.shape:
        return float("inf")
    if want.size == 0:
        return 0.0
    scale = max(1.0, float(np.max(np.abs(want))))
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return float(np.max(diff)) / scale if np.all(np.isfinite(got)) else float("inf")


def check(names: Sequence[str], got: Sequence[np.ndarray], want: Sequence[np.ndarray], precision: str,
          where: str) -> GateResult:
    """Compare; raise ConversionRefusedError naming every output over the tolerance."""
    tolerance = TOLERANCE.get(precision, TOLERANCE["fp32"])
    errors = {name: output_error(g, w) for name, g, w in zip(names, got, want)}
    bad = {name: e for name, e in errors.items() if not e <= tolerance}
    if bad:
        shapes = {name: (g.shape, w.shape) for name, g, w in zip(names, got, want)}
        shown = ", ".join(f"{name}: {e:.3g}" if shapes[name][0] == shapes[name][1]
                          else f"{name}: shape {shapes[name][0]} vs onnxruntime's {shapes[name][1]}"
                          for name, e in bad.items())
        raise ConversionRefusedError(
            f"ncnn: converted model refused for {where}: outputs differ from onnxruntime beyond "
            f"{tolerance:g} ({precision}): {shown}")
    return GateResult(errors, tolerance, tuple(tuple(w.shape) for w in want))
