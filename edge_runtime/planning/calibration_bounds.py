"""Sanity bounds on calibrated figures: what no real backend on this host can beat.

A figure outside its bound is a measurement artefact (a fused chain timed as one
node, a cache-resident copy timed as memory traffic, a noisy round), never a
fast backend. ``calibration.measure_speed`` re-measures once when any figure is
out of bounds and then refuses the ones still out, falling back to
``default_speed`` for those figures with a WARNING naming each.

* ``launch_us`` > 0: a chain of k nodes costs more than one node;
* ``mem_gbps`` and ``copy_gbps`` <= ``HOST_BANDWIDTH_SLACK`` x what numpy moves
  on this host at the same working-set size (the device reads the same memory
  on a phone's unified memory and on PoCL; threads buy at most a small factor).
  A device with memory of its own (a discrete GPU: OpenCL's ``host_unified_memory``
  false) reads it far faster than the host reads its own (an H200's OpenCL measured
  2.6 TB/s against the host's 29.5 GB/s), so its ``mem_gbps`` is held only under
  ``DEVICE_MEMORY_GBPS_MAX``; its ``copy_gbps`` crosses to the host and keeps the host's bound.
  NOTE: the bandwidth micro-model's 4 MB tensors sit in such a GPU's L2 (tens of MB), so there
  its figure is the cache's: 2.6, 5.2 and 18 TB/s in three runs on an H200, whose memory moves
  4.8. The estimate only prunes; ``auto`` measures the candidates (it chose that GPU correctly);
* ``stage_us``, ``copy_latency_us`` >= 0 and under a second-scale ceiling;
* ``gflops``, ``conv_gflops`` in (0.05, 1e5]: no host bound applies (a GPU may
  be far faster than the CPU), only plausibility.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Mapping

import numpy as np

HOST_BANDWIDTH_SLACK = 2.0
"""Bandwidth figures may exceed single-threaded numpy on the host by this factor at most."""

_LIMITS: dict[str, tuple[float, float, bool]] = {
    # figure: (low, high, low exclusive)
    "launch_us": (0.0, 1e4, True),
    "stage_us": (0.0, 1e5, False),
    "copy_latency_us": (0.0, 1e5, False),
    "gflops": (0.05, 1e5, True),
    "conv_gflops": (0.05, 1e5, True),
    "mem_gbps": (0.05, math.inf, True),
    "copy_gbps": (0.01, math.inf, True),
}
BANDWIDTH_FIGURES = ("mem_gbps", "copy_gbps")
DEVICE_MEMORY_GBPS_MAX = 20_000.0
"""A device's own memory bandwidth above this is an artefact (HBM3e parts move under 10 TB/s)."""


@functools.lru_cache(maxsize=8)
def host_bandwidth_gbps(elements: int = 1 << 20, repeat: int = 10) -> float:
    """GB/s (bytes read + written) numpy moves on this host over ``elements`` floats, best of
    ``repeat`` runs of a copy and of an add (whichever is faster); measured once per process."""
    src = np.random.default_rng(0).random(elements, dtype=np.float32)
    dst = np.empty_like(src)
    best_gbps = 0.0
    for moved, step in ((2 * src.nbytes, lambda: np.copyto(dst, src)),
                        (3 * src.nbytes, lambda: np.add(src, src, out=dst))):
        step()
        best_s = math.inf
        for _ in range(repeat):
            start = time.perf_counter()
            step()
            best_s = min(best_s, time.perf_counter() - start)
        best_gbps = max(best_gbps, moved / max(best_s, 1e-9) / 1e9)
    return best_gbps


def out_of_bounds(figures: Mapping[str, float | None], host_gbps: float,
                  own_memory: bool = False) -> dict[str, str]:
    """Figure name -> why it is impossible, for each of ``figures`` outside its bound (None: not measured).
    ``own_memory``: the device has memory of its own (see the module docstring)."""
    bad = {}
    for name, value in figures.items():
        if value is None or name not in _LIMITS:
            continue
        low, high, exclusive = _LIMITS[name]
        host_bound = name in BANDWIDTH_FIGURES and not (own_memory and name == "mem_gbps")
        if name == "mem_gbps" and own_memory:
            high = DEVICE_MEMORY_GBPS_MAX
        elif host_bound:
            high = HOST_BANDWIDTH_SLACK * host_gbps
        if not math.isfinite(value) or value < low or (exclusive and value == low):
            bad[name] = f"{value:.4g} is not {'>' if exclusive else '>='} {low:g}"
        elif value > high:
            bound = f"{HOST_BANDWIDTH_SLACK:g} x the host's {host_gbps:.1f} GB/s" if host_bound else f"{high:g}"
            bad[name] = f"{value:.4g} exceeds {bound}"
    return bad
