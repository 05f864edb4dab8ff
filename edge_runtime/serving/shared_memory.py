"""System shared-memory regions (Triton's extension): tensors passed by a local client without copies.

A client creates a POSIX shared-memory object (``shm_open`` key ``/name``),
registers a region of it (``name``, ``key``, ``offset``, ``byte_size``), then
names the region in its requests instead of sending tensor bytes. Inputs are
read as numpy views of the mapping (no copy); outputs are written into it.

Rules (every breach is an ``InvalidInputError`` naming the region and the numbers):

* keys are POSIX shm names only: one optional leading ``/``, then 1-255 of
  ``[A-Za-z0-9._-]``, not ``.`` or ``..`` (no path escapes out of ``/dev/shm``);
* a region must lie inside its object: ``offset + byte_size <= object size``;
  a tensor must lie inside its region;
* a region used by a running request is *leased*: unregistering it is refused
  until the request ends. The mapping itself is closed only once no numpy view
  of it is alive, so nothing can read freed memory even then.

NOTE: Python's ``multiprocessing.shared_memory`` registers opened objects with
its resource tracker, which unlinks them when this process exits (the
client's objects!) before Python 3.13's ``track=False``; the mapping is
therefore opened here directly from ``/dev/shm`` with ``os.open`` + ``mmap``.
"""

from __future__ import annotations

import mmap
import os
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_runtime.errors import InvalidInputError

SHM_ROOT = Path("/dev/shm")
_KEY = re.compile(r"/?([A-Za-z0-9._-]{1,255})")


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class SharedMemoryRegions:
    """The registered regions of one server; thread-safe (leases are taken on the loop, released anywhere)."""

    def __init__(self, root: Path = SHM_ROOT) -> None:
        self._root = Path(root)
        self._regions: dict[str, Region] = {}
        self._leases: Counter[str] = Counter()
        self._lock = threading.Lock()

    def register(self, name: str, key: Any, offset: Any, byte_size: Any) -> Region:
        """Map ``byte_size`` bytes at ``offset`` of shm object ``key`` as region ``name``."""
        _check_int(name, "offset", offset, 0)
        _check_int(name, "byte_size", byte_size, 1)
        path = self._root / _object_name(name, key)
        with self._lock:
            if name in self._regions:
                raise InvalidInputError(f"shared memory region {name!r} is already registered "
                                        f"(key {self._regions[name].key!r}); unregister it first")
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError as exc:
                raise InvalidInputError(f"shared memory region {name!r}: cannot open key {key!r}: "
                                        f"{exc.strerror}") from None
            try:
                size = os.fstat(fd).st_size
                if offset + byte_size > size:
                    raise InvalidInputError(
                        f"shared memory region {name!r}: offset {offset} + byte_size {byte_size} = "
                        f"{offset + byte_size} runs past the end of key {key!r} ({size} bytes)")
                mapping = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            region = Region(name, key, offset, byte_size, mapping)
            self._regions[name] = region
            return region

    def unregister(self, name: str | None = None) -> None:
        """Drop region ``name`` (None: every region); refused while a running request leases it."""
        with self._lock:
            names = [name] if name is not None else sorted(self._regions)
            if name is not None and name not in self._regions:
                raise InvalidInputError(f"shared memory region {name!r} is not registered; "
                                        f"registered: {sorted(self._regions)}")
            busy = {n: self._leases[n] for n in names if self._leases[n]}
            if busy:
                raise InvalidInputError("shared memory region(s) in use by running requests "
                                        f"(region: requests) {busy}; unregister after they finish")
            for region_name in names:
                _close(self._regions.pop(region_name).mapping)

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            if name is not None and name not in self._regions:
                raise InvalidInputError(f"shared memory region {name!r} is not registered; "
                                        f"registered: {sorted(self._regions)}")
            return [self._regions[n].to_dict() for n in ([name] if name else sorted(self._regions))]

    def lease(self) -> "RegionLease":
        """A lease for one request: the regions it touches stay registered until ``release``."""
        return RegionLease(self)

    def close(self) -> None:
        with self._lock:
            for region in self._regions.values():
                _close(region.mapping)
            self._regions.clear()

    def _take(self, name: str) -> Region:
        with self._lock:
            region = self._regions.get(name)
            if region is None:
                raise InvalidInputError(f"shared memory region {name!r} is not registered; "
                                        f"registered: {sorted(self._regions)}")
            self._leases[name] += 1
            return region

    def _give_back(self, names: Counter[str]) -> None:
        with self._lock:
            self._leases.subtract(names)
            self._leases += Counter()  # drop zero counts


class RegionLease:
    """The regions one request reads or writes; ``view`` bounds-checks, ``release`` ends the lease."""

    def __init__(self, regions: SharedMemoryRegions) -> None:
        self._regions = regions
        self._held: Counter[str] = Counter()

    def view(self, region_name: Any, offset: Any, byte_size: Any, tensor: str) -> memoryview:
        """``byte_size`` bytes at ``offset`` inside region ``region_name``, for ``tensor`` (error messages)."""
        if not isinstance(region_name, str) or not region_name:
            raise InvalidInputError(f"tensor {tensor!r}: shared_memory_region must be a region name, "
                                    f"got {region_name!r}")
        _check_int(region_name, f"tensor {tensor!r} shared_memory_offset", offset, 0)
        _check_int(region_name, f"tensor {tensor!r} shared_memory_byte_size", byte_size, 0)
        region = self._regions._take(region_name)
        self._held[region_name] += 1
        if offset + byte_size > region.byte_size:
            raise InvalidInputError(
                f"tensor {tensor!r}: shared_memory_offset {offset} + shared_memory_byte_size {byte_size} = "
                f"{offset + byte_size} runs past region {region_name!r} ({region.byte_size} bytes)")
        start = region.offset + offset
        return memoryview(region.mapping)[start:start + byte_size]

    def release(self) -> None:
        """End the lease (idempotent)."""
        held, self._held = self._held, Counter()
        if held:
            self._regions._give_back(held)


def _object_name(region: str, key: Any) -> str:
    match = _KEY.fullmatch(key) if isinstance(key, str) else None
    if match is None or match.group(1) in (".", ".."):
        raise InvalidInputError(f"shared memory region {region!r}: key {key!r} is not a POSIX shm name "
                                "('/' then 1-255 of A-Z a-z 0-9 . _ -)")
    return match.group(1)


def _check_int(region: str, what: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidInputError(f"shared memory region {region!r}: {what} must be an integer >= {minimum}, "
                                f"got {value!r}")


def _close(mapping: mmap.mmap) -> None:
    try:
        mapping.close()
    except BufferError:
        # NOTE: a numpy view of it is still alive (an answer not yet sent); the mapping closes with it.
        pass
