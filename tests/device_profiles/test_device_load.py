"""Live-load readers: GPU busy sources, thermal zones, /proc/stat."""

from __future__ import annotations

import os

import pytest

import device_trees as trees
from device_profiles import _fs
from device_profiles.load import cpu_busy_fraction, find_gpu_busy, read_cpu_times, read_gpu_busy, read_thermal


@pytest.mark.parametrize(("kind", "path", "text", "expected"), [
    ("kgsl_gpubusy", "/sys/class/kgsl/kgsl-3d0/gpubusy", "  3000  12000\n", 0.25),
    ("kgsl_gpubusy", "/sys/class/kgsl/kgsl-3d0/gpubusy", "0 0\n", 0.0),  # idle window
    ("kgsl_percentage", "/sys/class/kgsl/kgsl-3d0/gpu_busy_percentage", "37 %\n", 0.37),
    ("mali_utilization", "/sys/class/misc/mali0/device/utilization", "80\n", 0.80),
    ("devfreq_load", "/sys/class/devfreq/13000000.mali/load", "45@585000000Hz\n", 0.45),
    ("devfreq_load", "/sys/class/devfreq/gpufreq/load", "12\n", 0.12),
])
def test_gpu_busy_source_found_and_read(tmp_path, kind, path, text, expected):
    trees.write(tmp_path, path, text)
    source = find_gpu_busy(tmp_path)
    assert source == {"path": path, "kind": kind}
    assert read_gpu_busy(tmp_path, source) == pytest.approx(expected)


@pytest.mark.parametrize(("kind", "text"), [
    ("kgsl_gpubusy", "busy total\n"), ("kgsl_gpubusy", "5\n"), ("kgsl_gpubusy", "-1 10\n"),
    ("kgsl_percentage", "n/a\n"), ("devfreq_load", "\n"),
])
def test_gpu_busy_garbage_reads_as_none(tmp_path, kind, text):
    trees.write(tmp_path, "/sys/x/busy", text)
    assert read_gpu_busy(tmp_path, {"path": "/sys/x/busy", "kind": kind}) is None


def test_gpu_busy_without_source(tmp_path):
    assert find_gpu_busy(tmp_path) is None
    assert read_gpu_busy(tmp_path, None) is None
    assert read_gpu_busy(tmp_path, {"path": "/missing", "kind": "kgsl_gpubusy"}) is None


def test_thermal_zones_in_zone_order(tmp_path):
    zones = read_thermal(trees.adreno_phone(tmp_path))
    assert zones == [
        {"path": "/sys/class/thermal/thermal_zone0", "type": "cpu-0-0-usr", "temp_c": 41.3,
         "trip_points_c": [95.0, 115.0]},
        {"path": "/sys/class/thermal/thermal_zone10", "type": "gpuss-0-usr", "temp_c": 38.7, "trip_points_c": []},
    ]


def test_cpu_times_and_busy_fraction(tmp_path):
    trees.write(tmp_path, "/proc/stat", "cpu  300 0 100 1600 0 0 0 0 0 0\ncpu0 100 0 50 800 0 0 0 0 0 0\n"
                                         "cpu1 200 0 50 800 0 0 0 0 0 0\nintr 12345 0 0\nctxt 99\n")
    before = read_cpu_times(tmp_path)
    assert set(before) == {"cpu", "cpu0", "cpu1"}
    assert before["cpu0"] == {"user": 100, "nice": 0, "system": 50, "idle": 800, "iowait": 0, "irq": 0,
                              "softirq": 0, "steal": 0}
    trees.write(tmp_path, "/proc/stat", "cpu  600 0 100 1700 0 0 0 0 0 0\ncpu0 400 0 50 800 0 0 0 0 0 0\n"
                                         "cpu1 200 0 50 900 0 0 0 0 0 0\n")
    busy = cpu_busy_fraction(before, read_cpu_times(tmp_path))
    assert busy == {"cpu": pytest.approx(300 / 400), "cpu0": 1.0, "cpu1": 0.0}


def test_cpu_times_of_this_machine_cover_online_cores():
    times = read_cpu_times("/")
    online = _fs.parse_cpu_list(_fs.read_line("/", "/sys/devices/system/cpu/online")) or range(os.cpu_count())
    assert {f"cpu{n}" for n in online} <= set(times)
    assert "cpu" in times and times["cpu"]["idle"] > 0
