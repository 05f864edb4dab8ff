"""Counters and timings of compile-time work, reported by ``describe()``.

Tests assert on these counters (cache hits, tuning runs) rather than on
wall-clock time, which is noisy on shared machines.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields


@dataclass
class CompileStats:
    """Mutable, thread-safe tallies; one instance per backend (shared by its executables)."""

    program_builds: int = 0  # clBuildProgram from source
    binary_hits: int = 0  # programs loaded from the disk cache
    binary_rejected: int = 0  # cache files found corrupt or refused by the driver
    tuning_measured: int = 0  # kernels whose candidates were timed
    tuning_hits: int = 0  # kernels whose choice came from the tuning cache
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
