"""LoadMonitor readers against fake sysfs/procfs trees in tmp_path, pins, and the sampling thread.

The oracle is arithmetic on the numbers written into the fake files.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from edge_runtime.errors import ConfigError
from edge_runtime.load_monitor import LoadConfig, LoadMonitor, load_config


def _write(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def _stat(cores: list[tuple[int, int]]) -> str:
    """/proc/stat with per-core (busy, idle) jiffies: busy as user time."""
    total_busy, total_idle = sum(b for b, _ in cores), sum(i for _, i in cores)
    lines = [f"cpu  {total_busy} 0 0 {total_idle} 0 0 0 0 0 0"]
    lines += [f"cpu{n} {b} 0 0 {i} 0 0 0 0 0 0" for n, (b, i) in enumerate(cores)]
    return "\n".join(lines + ["intr 1 2 3", "ctxt 99"]) + "\n"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_cpu_utilisation_per_core_overall_and_our_own_share(tmp_path: Path) -> None:
    _write(tmp_path, "/proc/stat", _stat([(100, 900), (200, 800)]))
    clock, own_cpu_s = FakeClock(), [5.0]
    monitor = LoadMonitor(root=tmp_path, gpu_source={}, process_cpu_s=lambda: own_cpu_s[0], clock=clock)
    _write(tmp_path, "/proc/stat", _stat([(175, 925), (225, 875)]))  # +75/100 busy, +25/100 busy
    clock.now += 2.0
    own_cpu_s[0] += 1.0  # one CPU-second of ours over 2 s on 2 cores = 25 %
    reading = monitor.sample()
    assert reading.cpu_busy_per_core == pytest.approx((0.75, 0.25))
    assert reading.cpu_busy == pytest.approx(0.5)
    assert reading.cpu_busy_own == pytest.approx(0.25)
    assert reading.cpu_busy_others == pytest.approx(0.25)
    assert reading.at == clock.now and monitor.reading is reading


def test_memory_pressure_from_meminfo_and_psi(tmp_path: Path) -> None:
    _write(tmp_path, "/proc/meminfo", "MemTotal:  4000 kB\nMemFree: 100 kB\nMemAvailable:  1000 kB\n")
    _write(tmp_path, "/proc/pressure/memory",
           "some avg10=12.50 avg60=3.00 avg300=1.00 total=1234\nfull avg10=2.00 avg60=0.00 avg300=0.00 total=5\n")
    reading = LoadMonitor(root=tmp_path, gpu_source={}).sample()
    assert reading.mem_used_fraction == pytest.approx(0.75)
    assert reading.mem_available_bytes == 1000 * 1024
    assert reading.mem_stall_fraction == pytest.approx(0.125)
    bare = LoadMonitor(root=tmp_path / "empty", gpu_source={}).sample()
    assert bare.mem_used_fraction is None and bare.mem_stall_fraction is None and bare.cpu_busy is None


@pytest.mark.parametrize("path, text, kind, busy", [
    ("/sys/class/kgsl/kgsl-3d0/gpubusy", "  300  1000\n", "kgsl_gpubusy", 0.3),
    ("/sys/class/kgsl/kgsl-3d0/gpubusy", "0 0\n", "kgsl_gpubusy", 0.0),
    ("/sys/class/kgsl/kgsl-3d0/gpu_busy_percentage", "64 %\n", "kgsl_percentage", 0.64),
    ("/sys/class/misc/mali0/device/utilization", "45\n", "mali_utilization", 0.45),
])
def test_gpu_busy_from_driver_counters(tmp_path: Path, path: str, text: str, kind: str, busy: float) -> None:
    _write(tmp_path, path, text)
    monitor = LoadMonitor(root=tmp_path)  # finds the source under root, as the probe does
    reading = monitor.sample()
    assert reading.gpu_busy == pytest.approx(busy) and reading.gpu_busy_source == kind
    _write(tmp_path, path, "garbage\n")
    assert monitor.sample().gpu_busy == 0.0  # unreadable counter: falls back to our own occupancy


def test_gpu_busy_estimated_from_our_own_runs_when_no_counter(tmp_path: Path) -> None:
    clock = FakeClock()
    monitor = LoadMonitor(LoadConfig(gpu_window_ms=1000), root=tmp_path, gpu_source={}, clock=clock)
    start = clock.now
    monitor.note_gpu_busy(start - 5.0, start - 4.0)  # outside the window: forgotten
    monitor.note_gpu_busy(start - 0.9, start - 0.6)  # 0.3 s
    monitor.note_gpu_busy(start - 0.7, start - 0.5)  # overlaps: adds 0.1 s
    monitor.note_gpu_busy(start - 0.2, start - 0.1)  # 0.1 s
    reading = monitor.sample()
    assert reading.gpu_busy == pytest.approx(0.5) and reading.gpu_busy_own == pytest.approx(0.5)
    assert reading.gpu_busy_source == "own_queue" and reading.gpu_busy_others == pytest.approx(0.0)
    clock.now += 2.0
    assert monitor.sample().gpu_busy == 0.0


def test_kgsl_counter_includes_our_own_share(tmp_path: Path) -> None:
    _write(tmp_path, "/sys/class/kgsl/kgsl-3d0/gpubusy", "800 1000\n")
    clock = FakeClock()
    monitor = LoadMonitor(root=tmp_path, clock=clock)
    monitor.note_gpu_busy(clock.now - 0.3, clock.now)
    reading = monitor.sample()
    assert reading.gpu_busy == pytest.approx(0.8) and reading.gpu_busy_others == pytest.approx(0.5)


def test_thermal_zones_trip_points_headroom_and_throttling(tmp_path: Path) -> None:
    _write(tmp_path, "/sys/class/thermal/thermal_zone0/type", "cpu-0-0\n")
    _write(tmp_path, "/sys/class/thermal/thermal_zone0/temp", "45000\n")
    _write(tmp_path, "/sys/class/thermal/thermal_zone0/trip_point_0_temp", "95000\n")
    _write(tmp_path, "/sys/class/thermal/thermal_zone0/trip_point_1_temp", "115000\n")
    _write(tmp_path, "/sys/class/thermal/thermal_zone1/type", "gpu\n")
    _write(tmp_path, "/sys/class/thermal/thermal_zone1/temp", "60000\n")
    _write(tmp_path, "/sys/class/thermal/thermal_zone1/trip_point_0_temp", "90000\n")
    monitor = LoadMonitor(root=tmp_path, gpu_source={})
    reading = monitor.sample()
    assert [(z.type, z.temp_c, z.trip_points_c) for z in reading.thermal] == [
        ("cpu-0-0", 45.0, (95.0, 115.0)), ("gpu", 60.0, (90.0,))]
    assert reading.thermal_headroom_c == pytest.approx(30.0) and not reading.throttled
    _write(tmp_path, "/sys/class/thermal/thermal_zone1/temp", "91000\n")
    hot = monitor.sample()
    assert hot.thermal_headroom_c == pytest.approx(-1.0) and hot.throttled


def test_pins_override_readings_until_unpinned(tmp_path: Path) -> None:
    _write(tmp_path, "/sys/class/kgsl/kgsl-3d0/gpubusy", "100 1000\n")
    monitor = LoadMonitor(load_config({"pin_gpu_busy": 0.9}), root=tmp_path)
    assert monitor.reading.gpu_busy == 0.9 and monitor.reading.pinned == ("gpu_busy",)
    assert monitor.sample().gpu_busy == 0.9  # sampling keeps the pin
    monitor.pin(cpu_busy=0.5)
    assert monitor.reading.cpu_busy == 0.5 and monitor.reading.pinned == ("cpu_busy", "gpu_busy")
    monitor.unpin("gpu_busy")
    assert monitor.reading.gpu_busy == pytest.approx(0.1) and monitor.reading.cpu_busy == 0.5
    monitor.unpin()
    assert monitor.reading.pinned == ()
    with pytest.raises(ConfigError, match="cannot pin 'temperature'"):
        monitor.pin(temperature=0.3)
    with pytest.raises(ConfigError, match=r"fraction in \[0, 1\], got 1.5"):
        monitor.pin(gpu_busy=1.5)


def test_load_config_rejects_unknown_keys_and_bad_values() -> None:
    with pytest.raises(ConfigError, match="unknown key"):
        load_config({"pin_gpu": 0.5})
    with pytest.raises(ConfigError, match="pin_gpu_busy must be in"):
        load_config({"pin_gpu_busy": 2})
    assert load_config({"sample_interval_ms": 50}).sample_interval_ms == 50


def test_background_thread_samples_at_the_configured_rate(tmp_path: Path) -> None:
    _write(tmp_path, "/sys/class/kgsl/kgsl-3d0/gpubusy", "100 1000\n")
    with LoadMonitor(LoadConfig(sample_interval_ms=10), root=tmp_path) as monitor:
        first = monitor.reading
        assert first.gpu_busy == pytest.approx(0.1)  # start() samples at once
        _write(tmp_path, "/sys/class/kgsl/kgsl-3d0/gpubusy", "700 1000\n")
        deadline = time.monotonic() + 5.0
        while monitor.reading.gpu_busy != pytest.approx(0.7) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert monitor.reading.gpu_busy == pytest.approx(0.7) and monitor.reading.at > first.at
    stopped_at = monitor.reading.at
    time.sleep(0.05)
    assert monitor.reading.at == stopped_at  # stop() ended the thread
