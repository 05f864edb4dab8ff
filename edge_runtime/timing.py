"""Latency measurement shared by the CLI's ``run`` and ``demo``."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np


def measure_ms(call: Callable[[], object], repeat: int, warmup: int = 1) -> list[float]:
    """Call ``call`` ``warmup`` times unmeasured, then ``repeat`` times; wall ms of each."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def summarise_ms(samples: list[float]) -> dict[str, float]:
    """p50/p95/mean/min/max of latency samples, rounded to µs."""
    values = np.asarray(samples, dtype=np.float64)
    return {"p50": round(float(np.percentile(values, 50)), 3),
            "p95": round(float(np.percentile(values, 95)), 3),
            "mean": round(float(values.mean()), 3),
            "min": round(float(values.min()), 3),
            "max": round(float(values.max()), 3),
            "n": int(values.size)}
