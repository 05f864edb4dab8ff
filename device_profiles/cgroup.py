"""cgroup limits of this process: CPU quota, memory limit, cpuset (v1 and v2).

Containers (docker, redroid cloud phones, Kubernetes pods) see the host's
cores in /proc/cpuinfo and the host's memory in /proc/meminfo; only the cgroup
says how much of them this process may use.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from device_profiles import _fs

log = logging.getLogger(__name__)

CGROUP_MOUNT = "/sys/fs/cgroup"
NO_LIMIT_BYTES = 1 << 60  # v1 writes "no limit" as a huge page-rounded number (9223372036854771712)
_V1_MOUNTS = {
    "cpu": ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpuacct,cpu"),
    "memory": ("/sys/fs/cgroup/memory",),
    "cpuset": ("/sys/fs/cgroup/cpuset",),
}


def read_cgroup(root: str | os.PathLike) -> dict:
    """The process's cgroup facts.

    Returns ``{version: 1|2|None, path, cpu_quota_cores, memory_limit_bytes,
    memory_usage_bytes, cpuset_cpus}``; a limit is None when there is none.
    Limits are read at the process's own cgroup (from ``/proc/self/cgroup``)
    and at every ancestor up to the mount root; the tightest one wins, since
    a parent's limit binds its children too.
    """
    own = _own_paths(root)
    if _fs.is_file(root, f"{CGROUP_MOUNT}/cgroup.controllers"):
        return _read_v2(root, own.get("", "/"))
    if any(_fs.is_dir(root, m) for mounts in _V1_MOUNTS.values() for m in mounts):
        return _read_v1(root, own)
    return {"version": None, "path": None, "cpu_quota_cores": None, "memory_limit_bytes": None,
            "memory_usage_bytes": None, "cpuset_cpus": None}


def _own_paths(root: str | os.PathLike) -> dict[str, str]:
    """Controller name -> cgroup path from ``/proc/self/cgroup``; key "" is the v2 hierarchy."""
    paths: dict[str, str] = {}
    for line in (_fs.read_text(root, "/proc/self/cgroup") or "").splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        for controller in parts[1].split(","):
            paths[controller] = parts[2]
    return paths


def _ancestors(path: str) -> list[str]:
    """``"/a/b"`` -> ``["/a/b", "/a", ""]`` (relative to a mount; "" is the mount root)."""
    parts = [p for p in path.split("/") if p and p != ".."]
    return ["/" + "/".join(parts[:i]) if i else "" for i in range(len(parts), -1, -1)]


def _tightest(root: str | os.PathLike, mounts: tuple[str, ...], path: str, filename: str,
              parse: Callable[[str | None], float | int | None]) -> float | int | None:
    """The smallest limit ``parse`` finds in ``filename`` at ``path`` or any ancestor, in any mount."""
    limits = []
    for mount in mounts:
        for ancestor in _ancestors(path):
            value = parse(_fs.read_line(root, f"{mount}{ancestor}/{filename}"))
            if value is not None:
                limits.append(value)
    return min(limits) if limits else None


def _first(root: str | os.PathLike, mounts: tuple[str, ...], path: str, filenames: tuple[str, ...],
           parse: Callable[[str | None], object]) -> object:
    """The value of the deepest readable file among ``filenames`` (own cgroup first, then ancestors)."""
    for mount in mounts:
        for ancestor in _ancestors(path):
            for filename in filenames:
                value = parse(_fs.read_line(root, f"{mount}{ancestor}/{filename}"))
                if value is not None:
                    return value
    return None


def _read_v2(root: str | os.PathLike, path: str) -> dict:
    mounts = (CGROUP_MOUNT,)
    return {
        "version": 2,
        "path": path,
        "cpu_quota_cores": _tightest(root, mounts, path, "cpu.max", parse_cpu_max),
        "memory_limit_bytes": _tightest(root, mounts, path, "memory.max", _parse_memory_limit),
        "memory_usage_bytes": _first(root, mounts, path, ("memory.current",), _fs.parse_int),
        "cpuset_cpus": _first(root, mounts, path, ("cpuset.cpus.effective", "cpuset.cpus"),
                              _fs.parse_cpu_list),
    }


def _read_v1(root: str | os.PathLike, own: dict[str, str]) -> dict:
    cpu_path = own.get("cpu", "/")
    mem_path = own.get("memory", "/")
    cpuset_path = own.get("cpuset", "/")
    quotas = []
    for mount in _V1_MOUNTS["cpu"]:
        for ancestor in _ancestors(cpu_path):
            quota = _fs.read_int(root, f"{mount}{ancestor}/cpu.cfs_quota_us")
            period = _fs.read_int(root, f"{mount}{ancestor}/cpu.cfs_period_us")
            if quota is not None and quota > 0 and period:
                quotas.append(quota / period)
    return {
        "version": 1,
        "path": cpu_path,
        "cpu_quota_cores": min(quotas) if quotas else None,
        "memory_limit_bytes": _tightest(root, _V1_MOUNTS["memory"], mem_path, "memory.limit_in_bytes",
                                        _parse_memory_limit),
        "memory_usage_bytes": _first(root, _V1_MOUNTS["memory"], mem_path, ("memory.usage_in_bytes",),
                                     _fs.parse_int),
        "cpuset_cpus": _first(root, _V1_MOUNTS["cpuset"], cpuset_path,
                              ("cpuset.effective_cpus", "cpuset.cpus"), _fs.parse_cpu_list),
    }


def parse_cpu_max(line: str | None) -> float | None:
    """cgroup v2 ``cpu.max`` (``"200000 100000"`` -> 2.0; ``"max 100000"`` -> None)."""
    tokens = (line or "").split()
    if not tokens or tokens[0] == "max":
        return None
    quota = _fs.parse_int(tokens[0])
    period = _fs.parse_int(tokens[1]) if len(tokens) > 1 else 100000  # the kernel's default period
    if quota is None or period is None or quota <= 0 or period <= 0:
        return None
    return quota / period


def _parse_memory_limit(line: str | None) -> int | None:
    if line is None or line.strip() == "max":
        return None
    value = _fs.parse_int(line)
    if value is None or value <= 0 or value >= NO_LIMIT_BYTES:
        return None
    return value
