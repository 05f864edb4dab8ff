"""A per-model cache of inference results: LRU with a TTL and a byte budget, off by default.

The key is a SHA-256 over the model name, its version and every input's
name, dtype, shape and bytes, so only a byte-identical request hits. Only
successful results are stored (the caller puts after success). A hit returns
the stored arrays themselves, marked read-only, so a hit's response bytes
are the miss's.

When it helps: deterministic models that see the same input again (a UI
screenshot re-sent unchanged, a fixed prompt image, health probes). When it
hurts: inputs that never repeat (camera frames) pay a hash of every input
and hold memory for nothing; a model whose output should change between
calls (sampling, stateful) must not enable it. Per model, in its
``config.toml``::

    [result_cache]
    enabled = true
    max_bytes = 16777216   # stored outputs, all entries together
    max_entries = 1024
    ttl_s = 60.0           # 0 = entries never expire
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from edge_runtime.config import from_table
from edge_runtime.errors import ConfigError

MIB = 1024 * 1024


@dataclass(frozen=True)
class ResultCacheConfig:
    enabled: bool = False
    max_bytes: int = 16 * MIB
    max_entries: int = 1024
    ttl_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_entries < 1 or self.ttl_s < 0:
            raise ConfigError("[result_cache] max_bytes and max_entries must be >= 1, ttl_s >= 0; "
                              f"got {self.max_bytes}, {self.max_entries}, {self.ttl_s}")


def result_cache_config(table: Mapping[str, Any] | None, where: str) -> ResultCacheConfig:
    """The model's ``[result_cache]`` table; ConfigError names ``where`` and the key."""
    return from_table(ResultCacheConfig, table, "result_cache", where)


@dataclass
class _Entry:
    outputs: dict[str, np.ndarray]
    nbytes: int
    stored_at: float


class ResultCache:
    """Thread-safe LRU of outputs by request key (see the module docstring)."""

    def __init__(self, config: ResultCacheConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0  # entries dropped for room or age

    @staticmethod
    def key(model: str, version: int | str, feeds: Mapping[str, np.ndarray]) -> bytes:
        digest = hashlib.sha256(f"{model}\0{version}\0".encode())
        for name in sorted(feeds):
            array = np.ascontiguousarray(feeds[name])
            digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
            if array.dtype.kind == "O":  # BYTES tensors: length-prefixed elements, so splits differ
                for item in array.reshape(-1):
                    data = item if isinstance(item, bytes) else str(item).encode()
                    digest.update(len(data).to_bytes(8, "little") + data)
            else:
                digest.update(array.tobytes())
        return digest.digest()

    def get(self, key: bytes) -> dict[str, np.ndarray] | None:
        """The stored outputs (read-only arrays), or None on a miss or an expired entry."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and self.config.ttl_s and self._clock() - entry.stored_at > self.config.ttl_s:
                self._drop(key)
                entry = None
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return dict(entry.outputs)

    def put(self, key: bytes, outputs: Mapping[str, np.ndarray]) -> bool:
        """Store a successful result; False when it alone exceeds ``max_bytes`` (not stored)."""
        stored = {}
        for name, value in outputs.items():
            array = np.array(value, copy=True)  # the caller may reuse its buffers
            array.flags.writeable = False
            stored[name] = array
        nbytes = sum(a.nbytes for a in stored.values())
        if nbytes > self.config.max_bytes:
            return False
        with self._lock:
            if key in self._entries:
                self._drop(key)
            while self._entries and (self.bytes + nbytes > self.config.max_bytes
                                     or len(self._entries) >= self.config.max_entries):
                self._drop(next(iter(self._entries)))
            self._entries[key] = _Entry(stored, nbytes, self._clock())
            self.bytes += nbytes
        return True

    def _drop(self, key: bytes) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.nbytes
        self.evictions += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._entries), "bytes": self.bytes, "hits": self.hits, "misses": self.misses,
                    "evictions": self.evictions}
