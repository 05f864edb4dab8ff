"""Memory facts: /proc/meminfo combined with the cgroup memory limit."""

from __future__ import annotations

import os

from device_profiles import _fs


def read_meminfo(root: str | os.PathLike) -> dict[str, int]:
    """``/proc/meminfo`` as field -> bytes (``kB`` values are converted); {} when unreadable."""
    fields: dict[str, int] = {}
    for line in (_fs.read_text(root, "/proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        tokens = rest.split()
        if not key or not tokens:
            continue
        value = _fs.parse_int(tokens[0])
        if value is None or value < 0:
            continue
        fields[key.strip()] = value * 1024 if len(tokens) > 1 and tokens[1].lower() == "kb" else value
    return fields


def read_memory(root: str | os.PathLike, cgroup: dict) -> dict:
    """``{total_bytes, available_bytes, limit_bytes, usable_bytes}``; each None when unknown.

    ``usable_bytes`` is the capacity this process may grow to: the smaller of
    the machine's total and the cgroup limit (a container's /proc/meminfo shows
    the host). ``available_bytes`` is what is free now, also capped by what the
    cgroup still allows (limit minus its current usage).
    """
    info = read_meminfo(root)
    total = info.get("MemTotal")
    available = info.get("MemAvailable")
    if available is None and "MemFree" in info:  # kernels before 3.14 lack MemAvailable
        available = info["MemFree"] + info.get("Cached", 0) + info.get("Buffers", 0)
    limit = cgroup.get("memory_limit_bytes")
    usage = cgroup.get("memory_usage_bytes")
    if limit is not None:
        room = max(0, limit - usage) if usage is not None else limit
        available = room if available is None else min(available, room)
    known = [v for v in (total, limit) if v is not None]
    return {
        "total_bytes": total,
        "available_bytes": available,
        "limit_bytes": limit,
        "usable_bytes": min(known) if known else None,
    }
