"""``LoadMonitor``: live load of the device as a cheap, frozen ``LoadReading`` snapshot.

A background thread samples, every ``sample_interval_ms``:

* CPU utilisation per core and overall (``/proc/stat`` deltas), and this
  process's own share (``time.process_time`` delta over wall time x cores), so
  a policy can tell competing load from the load we cause ourselves;
* memory pressure: used fraction (``MemAvailable``/``MemTotal``) and, where
  the kernel has PSI, the share of time tasks stalled on memory
  (``/proc/pressure/memory`` ``some avg10``);
* GPU busy: the driver's counter (Adreno kgsl, Mali utilisation, devfreq
  load; found by ``device_profiles.load``), else an estimate from our own GPU
  occupancy — the scheduler calls :meth:`LoadMonitor.note_gpu_busy` around
  every GPU plan run and the monitor reports the busy share of the last
  ``gpu_window_ms``;
* thermal zones with their trip points (headroom to the lowest trip).

Readers take a root directory, so tests point them at a fake sysfs tree.
``reading`` returns the latest snapshot without touching a file: it is safe
on the hot path. ``pin(gpu_busy=0.9)`` / ``unpin()`` (or ``[load] pin_gpu_busy``
in configuration) override fields, for operators and tests.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from device_profiles import _fs
from device_profiles.load import cpu_busy_fraction, find_gpu_busy, read_cpu_times, read_gpu_busy, read_thermal
from device_profiles.memory import read_meminfo
from edge_runtime.config import from_mapping
from edge_runtime.errors import ConfigError

log = logging.getLogger(__name__)

PINNABLE = ("cpu_busy", "cpu_busy_own", "gpu_busy", "gpu_busy_own", "mem_used_fraction")
_MAX_GPU_INTERVALS = 4096  # bound on remembered GPU runs: memory stays flat under any load


@dataclass(frozen=True)
class LoadConfig:
    """The ``[load]`` table: sampling rate, GPU estimate window, pinned readings (0..1)."""

    sample_interval_ms: int = 250
    gpu_window_ms: int = 1000
    pin_cpu_busy: float | None = None
    pin_gpu_busy: float | None = None
    pin_mem_used_fraction: float | None = None

    def __post_init__(self) -> None:
        if self.sample_interval_ms < 1 or self.gpu_window_ms < 1:
            raise ConfigError("[load] sample_interval_ms and gpu_window_ms must be >= 1")
        for name in ("pin_cpu_busy", "pin_gpu_busy", "pin_mem_used_fraction"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ConfigError(f"[load] {name} must be in [0, 1], got {value}")

    def pins(self) -> dict[str, float]:
        return {name[len("pin_"):]: getattr(self, name)
                for name in ("pin_cpu_busy", "pin_gpu_busy", "pin_mem_used_fraction")
                if getattr(self, name) is not None}


def load_config(data: Mapping[str, Any] | None = None, where: str = "config") -> LoadConfig:
    """A LoadConfig from a parsed ``[load]`` table; unknown keys are ConfigError."""
    return from_mapping(LoadConfig, dict(data or {}), f"{where}: [load]")


@dataclass(frozen=True)
class ThermalZone:
    type: str | None
    temp_c: float | None
    trip_points_c: tuple[float, ...]


@dataclass(frozen=True)
class LoadReading:
    """One snapshot of device load; fractions are 0..1, None where unknown.

    ``gpu_busy`` and ``cpu_busy`` include our own work; ``*_own`` is our share,
    and ``*_others`` what the rest of the device adds. ``pinned`` names the
    fields an operator or a test overrode.
    """

    at: float = 0.0  # time.monotonic() of the sample
    cpu_busy: float | None = None
    cpu_busy_per_core: tuple[float, ...] = ()
    cpu_busy_own: float | None = None
    gpu_busy: float | None = None
    gpu_busy_own: float | None = None
    gpu_busy_source: str = "none"  # kgsl_gpubusy, mali_utilization, devfreq_load, own_queue, pinned, none
    mem_used_fraction: float | None = None
    mem_stall_fraction: float | None = None
    mem_available_bytes: int | None = None
    thermal: tuple[ThermalZone, ...] = ()
    pinned: tuple[str, ...] = ()

    @property
    def cpu_busy_others(self) -> float | None:
        if self.cpu_busy is None:
            return None
        return max(0.0, self.cpu_busy - (self.cpu_busy_own or 0.0))

    @property
    def gpu_busy_others(self) -> float | None:
        if self.gpu_busy is None:
            return None
        return max(0.0, self.gpu_busy - (self.gpu_busy_own or 0.0))

    @property
    def thermal_headroom_c(self) -> float | None:
        """Smallest (lowest trip point - temperature) over zones that have both."""
        gaps = [min(z.trip_points_c) - z.temp_c for z in self.thermal if z.trip_points_c and z.temp_c is not None]
        return min(gaps) if gaps else None

    @property
    def throttled(self) -> bool:
        """Some zone has reached its lowest trip point (the kernel is cooling it)."""
        headroom = self.thermal_headroom_c
        return headroom is not None and headroom <= 0.0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(cpu_busy_others=self.cpu_busy_others, gpu_busy_others=self.gpu_busy_others,
                    thermal_headroom_c=self.thermal_headroom_c, throttled=self.throttled)
        return data


class LoadMonitor:
    """Samples live load in a background thread; ``reading`` is the latest snapshot.

    ``root`` is the filesystem root to read (a fake tree in tests).
    ``gpu_source`` is a ``device_profiles.load.find_gpu_busy`` result (the
    probe's ``load_sources.gpu_busy``); None looks it up under root, ``{}``
    means "no driver counter" (GPU busy is then our own occupancy).
    ``process_cpu_s`` returns this process's CPU seconds and ``clock`` the
    time in seconds (``time.monotonic``, the clock of ``note_gpu_busy``); both
    are injectable for tests.
    """

    def __init__(self, config: LoadConfig | None = None, root: str | os.PathLike = "/",
                 gpu_source: Mapping[str, Any] | None = None,
                 process_cpu_s: Callable[[], float] = time.process_time,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or LoadConfig()
        self.root = os.fspath(root)
        self._gpu_source = find_gpu_busy(self.root) if gpu_source is None else dict(gpu_source)
        self._process_cpu_s = process_cpu_s
        self._clock = clock
        self._lock = threading.Lock()
        self._gpu_runs: deque[tuple[float, float]] = deque(maxlen=_MAX_GPU_INTERVALS)
        self._pins: dict[str, float] = {}
        self._prev_times = read_cpu_times(self.root)
        self._prev_own = (clock(), process_cpu_s())
        self._raw = LoadReading(at=clock())
        self._reading = self._raw
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.config.pins():
            self.pin(**self.config.pins())

    # -- hot path ------------------------------------------------------------------
    @property
    def reading(self) -> LoadReading:
        """The latest snapshot (pins applied); reads no file."""
        return self._reading

    def note_gpu_busy(self, start_s: float, end_s: float) -> None:
        """Record that our own work kept the GPU busy from ``start_s`` to ``end_s`` (time.monotonic())."""
        if end_s > start_s:
            with self._lock:
                self._gpu_runs.append((start_s, end_s))

    # -- overrides -----------------------------------------------------------------
    def pin(self, **values: float) -> None:
        """Override readings, e.g. ``pin(gpu_busy=0.9)``; fields: ``PINNABLE``, values in [0, 1]."""
        for name, value in values.items():
            if name not in PINNABLE:
                raise ConfigError(f"cannot pin {name!r}; pinnable readings: {list(PINNABLE)}")
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ConfigError(f"pinned {name} must be a fraction in [0, 1], got {value!r}")
        with self._lock:
            self._pins.update({name: float(value) for name, value in values.items()})
            self._publish()

    def unpin(self, *names: str) -> None:
        """Drop the named pins (all of them when none is named)."""
        with self._lock:
            for name in names or tuple(self._pins):
                self._pins.pop(name, None)
            self._publish()

    def _publish(self) -> None:
        # Caller holds the lock.
        source = {"gpu_busy_source": "pinned"} if "gpu_busy" in self._pins else {}
        self._reading = dataclasses.replace(self._raw, **self._pins, **source, pinned=tuple(sorted(self._pins)))

    # -- sampling ------------------------------------------------------------------
    def sample(self) -> LoadReading:
        """Read every source now, publish and return the new snapshot."""
        now = self._clock()
        times = read_cpu_times(self.root)
        busy = cpu_busy_fraction(self._prev_times, times)
        self._prev_times = times
        per_core = tuple(busy[name] for name in sorted(busy, key=_core_number) if name != "cpu")
        own_cpu_s = self._process_cpu_s()
        then, then_cpu_s = self._prev_own
        self._prev_own = (now, own_cpu_s)
        cores = len(per_core) or os.cpu_count() or 1
        own = min(1.0, max(0.0, (own_cpu_s - then_cpu_s) / ((now - then) * cores))) if now > then else None
        gpu_own = self._gpu_own_share(now)
        gpu = read_gpu_busy(self.root, dict(self._gpu_source)) if self._gpu_source else None
        meminfo = read_meminfo(self.root)
        raw = LoadReading(
            at=now,
            cpu_busy=busy.get("cpu"),
            cpu_busy_per_core=per_core,
            cpu_busy_own=own if "cpu" in busy else None,
            gpu_busy=gpu if gpu is not None else gpu_own,
            gpu_busy_own=gpu_own,
            gpu_busy_source=str(self._gpu_source.get("kind")) if gpu is not None else "own_queue",
            mem_used_fraction=_used_fraction(meminfo),
            mem_stall_fraction=_memory_stall(self.root),
            mem_available_bytes=meminfo.get("MemAvailable"),
            thermal=tuple(ThermalZone(z["type"], z["temp_c"], tuple(z["trip_points_c"]))
                          for z in read_thermal(self.root)),
        )
        with self._lock:
            self._raw = raw
            self._publish()
            return self._reading

    def _gpu_own_share(self, now: float) -> float:
        window_s = self.config.gpu_window_ms / 1e3
        start = now - window_s
        with self._lock:
            while self._gpu_runs and self._gpu_runs[0][1] <= start:
                self._gpu_runs.popleft()
            runs = sorted(self._gpu_runs)
        covered, reach = 0.0, start
        for begin, end in runs:  # union of intervals: GPU workers may overlap
            begin, end = max(begin, reach), min(end, now)
            if end > begin:
                covered += end - begin
                reach = end
        return min(1.0, covered / window_s)

    def start(self) -> "LoadMonitor":
        """Start the sampling thread (idempotent); returns self."""
        if self._thread is None:
            self._stop.clear()
            self.sample()
            self._thread = threading.Thread(target=self._loop, name="edge-runtime-load", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.config.sample_interval_ms / 1e3):
            try:
                self.sample()
            except Exception:  # a reader bug must not stop load sampling for good
                log.exception("load sampling failed; keeping the previous reading")

    def __enter__(self) -> "LoadMonitor":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _core_number(name: str) -> int:
    digits = re.sub(r"\D", "", name)
    return int(digits) if digits else -1


def _used_fraction(meminfo: Mapping[str, int]) -> float | None:
    total, available = meminfo.get("MemTotal"), meminfo.get("MemAvailable")
    if not total or available is None:
        return None
    return min(1.0, max(0.0, 1.0 - available / total))


def _memory_stall(root: str) -> float | None:
    """PSI ``some avg10`` of /proc/pressure/memory as a fraction; None without PSI."""
    text = _fs.read_text(root, "/proc/pressure/memory", max_bytes=4096) or ""
    match = re.search(r"^some\b.*\bavg10=(\d+(?:\.\d+)?)", text, re.MULTILINE)
    return min(1.0, float(match.group(1)) / 100.0) if match else None
