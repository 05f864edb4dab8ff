"""Live-load sources and cheap readers for them (GPU busy, thermal zones, CPU times).

The probe finds the sources once; the scheduler's load monitor calls the
readers often, so they read one small file each and never raise.
"""

from __future__ import annotations

import os
import re

from device_profiles import _fs

# (kind, glob) in order of preference; the first that exists is the GPU busy source.
GPU_BUSY_SOURCES = (
    ("kgsl_gpubusy", "/sys/class/kgsl/kgsl-3d0/gpubusy"),
    ("kgsl_percentage", "/sys/class/kgsl/kgsl-3d0/gpu_busy_percentage"),
    ("mali_utilization", "/sys/class/misc/mali0/device/utilization"),
    ("mali_utilization", "/sys/devices/platform/*.mali/utilization"),
    ("devfreq_load", "/sys/class/devfreq/*gpu*/load"),
    ("devfreq_load", "/sys/class/devfreq/*mali*/load"),
    ("devfreq_load", "/sys/class/devfreq/*kgsl*/load"),
)
_CPU_TIME_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def find_gpu_busy(root: str | os.PathLike) -> dict | None:
    """``{path, kind}`` of the first GPU busy source present, or None."""
    for kind, pattern in GPU_BUSY_SOURCES:
        for path in _fs.glob(root, pattern):
            if _fs.is_file(root, path):
                return {"path": path, "kind": kind}
    return None


def read_gpu_busy(root: str | os.PathLike, source: dict | None) -> float | None:
    """The GPU's busy fraction (0..1) from a ``find_gpu_busy`` source; None when unreadable.

    ``kgsl_gpubusy`` holds "busy total" cycles of the kernel's last window
    (0 total = idle); the others hold a percentage, devfreq as "NN@FREQHz".
    """
    if not source or "path" not in source:
        return None
    line = _fs.read_line(root, source["path"])
    if line is None:
        return None
    if source.get("kind") == "kgsl_gpubusy":
        numbers = [_fs.parse_int(t) for t in line.split()[:2]]
        if len(numbers) != 2 or None in numbers or numbers[0] < 0 or numbers[1] < 0:
            return None
        busy, total = numbers
        return 0.0 if total == 0 else min(1.0, busy / total)
    match = re.match(r"^\s*(\d+(?:\.\d+)?)", line)
    if match is None:
        return None
    return min(1.0, float(match.group(1)) / 100.0)


def _celsius(raw: int | None) -> float | None:
    """Thermal sysfs reports millidegrees; a few drivers report whole degrees."""
    if raw is None:
        return None
    return raw / 1000.0 if abs(raw) >= 1000 else float(raw)


def read_thermal(root: str | os.PathLike) -> list[dict]:
    """``[{path, type, temp_c, trip_points_c}]`` for every thermal zone, sorted by zone number."""
    zones = []
    paths = _fs.glob(root, "/sys/class/thermal/thermal_zone*")
    for path in sorted(paths, key=lambda p: _fs.parse_int(re.sub(r"\D", " ", p.rsplit("/", 1)[-1])) or 0):
        trips = [_celsius(_fs.read_int(root, trip)) for trip in _fs.glob(root, f"{path}/trip_point_*_temp")]
        zones.append({
            "path": path,
            "type": _fs.read_line(root, f"{path}/type"),
            "temp_c": _celsius(_fs.read_int(root, f"{path}/temp")),
            "trip_points_c": sorted(t for t in trips if t is not None),
        })
    return zones


def read_cpu_times(root: str | os.PathLike) -> dict[str, dict[str, int]]:
    """``/proc/stat`` CPU lines: ``{"cpu": {...}, "cpu0": {user, nice, system, idle, ...}}`` in jiffies."""
    times: dict[str, dict[str, int]] = {}
    for line in (_fs.read_text(root, "/proc/stat") or "").splitlines():
        tokens = line.split()
        if not tokens or not re.fullmatch(r"cpu\d*", tokens[0]):
            continue
        values = [_fs.parse_int(t) for t in tokens[1:1 + len(_CPU_TIME_FIELDS)]]
        if not values or None in values:
            continue
        times[tokens[0]] = dict(zip(_CPU_TIME_FIELDS, values))
    return times


def cpu_busy_fraction(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, float]:
    """Busy fraction (0..1) per CPU line between two ``read_cpu_times`` snapshots."""
    busy: dict[str, float] = {}
    for name, end in after.items():
        start = before.get(name)
        if start is None:
            continue
        total = sum(end.values()) - sum(start.values())
        idle = (end.get("idle", 0) + end.get("iowait", 0)) - (start.get("idle", 0) + start.get("iowait", 0))
        if total > 0:
            busy[name] = min(1.0, max(0.0, (total - idle) / total))
    return busy


def find_load_sources(root: str | os.PathLike) -> dict:
    """``{gpu_busy: {path, kind} | None, thermal_zones: [...]}`` for the profile."""
    return {"gpu_busy": find_gpu_busy(root), "thermal_zones": read_thermal(root)}
