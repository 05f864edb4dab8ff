"""Calibration: a short micro-benchmark per backend, cached per backend + device key."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from backends.base import CompileOptions
from backends.cpu import CPUBackend
from edge_runtime.planning.calibration import CACHE_FILE, cached_speed, default_speed, measure_speed
from planning_fakes import RefusingBackend

OPTIONS = CompileOptions(intra_op_threads=2)


def test_measuring_the_cpu_backend_is_quick_and_plausible() -> None:
    start = time.perf_counter()
    speed = measure_speed(CPUBackend(), OPTIONS, on_host=True)
    elapsed_s = time.perf_counter() - start
    assert elapsed_s < 3.0, "the budget is 2 s; slack for a shared, noisy machine"
    assert speed.backend == "cpu" and speed.on_host and speed.copy_s(1 << 20) == 0.0
    # An ONNX Runtime matmul on any CPU from the last decade: between 0.1 and 10 000 GFLOP/s.
    assert 0.1 < speed.gflops < 1e4 and 0.1 < speed.mem_gbps < 1e4
    assert speed.conv_gflops is not None and 0.1 < speed.conv_gflops < 1e4
    assert 0 <= speed.launch_us < 1e4 and 0 <= speed.stage_us < 1e5


def test_a_device_backend_gets_copy_costs() -> None:
    speed = measure_speed(CPUBackend(), OPTIONS, on_host=False)
    assert speed.copy_gbps is not None and speed.copy_gbps > 0
    assert speed.copy_latency_us >= 0
    assert speed.copy_s(1 << 20) > 0, "even a device next to the host pays something per copy"


def test_speed_is_cached_per_backend_and_device_key(tmp_path: Path) -> None:
    calls: list[str] = []

    def measure(backend, options, on_host):
        calls.append(backend.name)
        return measure_speed(backend, options, on_host, budget_s=0.5)

    first = cached_speed(CPUBackend(), "device-a", tmp_path, OPTIONS, True, measure)
    again = cached_speed(CPUBackend(), "device-a", tmp_path, OPTIONS, True, measure)
    assert again == first and calls == ["cpu"], "the second call reads the cache"
    stored = json.loads((tmp_path / CACHE_FILE).read_text())
    (key,) = stored
    assert key.startswith("cpu|device-a|") and stored[key]["gflops"] == first.gflops
    cached_speed(CPUBackend(), "device-b", tmp_path, OPTIONS, True, measure)
    assert calls == ["cpu", "cpu"], "another device is measured again"
    assert len(json.loads((tmp_path / CACHE_FILE).read_text())) == 2


def test_a_corrupt_cache_is_measured_again_not_fatal(tmp_path: Path, caplog) -> None:
    (tmp_path / CACHE_FILE).write_text("{ not json")
    with caplog.at_level(logging.WARNING):
        speed = cached_speed(CPUBackend(), "k", tmp_path, OPTIONS, True,
                             lambda b, o, h: measure_speed(b, o, h, budget_s=0.3))
    assert speed.gflops > 0
    assert "unreadable" in caplog.text
    assert [k.split("|")[:2] for k in json.loads((tmp_path / CACHE_FILE).read_text())] == [["cpu", "k"]]


def test_a_backend_that_cannot_run_the_micro_models_gets_defaults_uncached(tmp_path: Path, caplog) -> None:
    backend = RefusingBackend(CPUBackend(), "picky", refuse_ops=("Add",))
    with caplog.at_level(logging.WARNING):
        speed = cached_speed(backend, "k", tmp_path, OPTIONS, False)
    assert speed == default_speed("picky", on_host=False)
    assert "cannot calibrate backend picky" in caplog.text
    assert not (tmp_path / CACHE_FILE).exists()
    assert backend.compiled == [], "refused before compiling anything"


def test_runtime_calibrates_once_per_device(tmp_path: Path) -> None:
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    runtime = Runtime(RuntimeConfig(cache_dir=tmp_path))
    speed = runtime.backend_speed("cpu")
    entries = json.loads((tmp_path / CACHE_FILE).read_text())
    (key,) = entries
    assert key.startswith("cpu|") and entries[key]["gflops"] == pytest.approx(speed.gflops)
    assert Runtime(RuntimeConfig(cache_dir=tmp_path)).backend_speed("cpu") == speed
    runtime.close()
