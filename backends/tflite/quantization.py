"""Affine (de)quantization of graph inputs and outputs: ``real = scale * (q - zero_point)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_QUANTIZED_DTYPES = frozenset({"int8", "uint8", "int16"})


@dataclass(frozen=True)
class QuantParams:
    """Per-tensor quantization of one graph input or output."""

    scale: float
    zero_point: int
    dtype: str  # the integer numpy dtype name on the wire

    def as_tuple(self) -> tuple[float, int]:
        return self.scale, self.zero_point


def quant_params(details: dict[str, Any]) -> QuantParams | None:
    """The per-tensor parameters in LiteRT tensor ``details``, or None (float or per-axis)."""
    dtype = np.dtype(details["dtype"]).name
    params = details.get("quantization_parameters", {})
    scales = np.asarray(params.get("scales", ()))
    zero_points = np.asarray(params.get("zero_points", ()))
    if dtype not in _QUANTIZED_DTYPES or scales.size != 1 or float(scales[0]) == 0.0:
        return None
    return QuantParams(float(scales[0]), int(zero_points[0]) if zero_points.size else 0, dtype)


def quantize(values: np.ndarray, params: QuantParams) -> np.ndarray:
    """Round ``values / scale + zero_point`` to the nearest integer and saturate to the dtype."""
    info = np.iinfo(params.dtype)
    scaled = np.round(np.asarray(values, dtype=np.float32) / np.float32(params.scale)) + params.zero_point
    return np.clip(scaled, info.min, info.max).astype(params.dtype)


def dequantize(values: np.ndarray, params: QuantParams) -> np.ndarray:
    """``scale * (values - zero_point)`` as float32."""
    return (np.asarray(values, dtype=np.float32) - np.float32(params.zero_point)) * np.float32(params.scale)
