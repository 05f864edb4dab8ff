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


# -- figures a fuser cannot fake, and sanity bounds ---------------------------------------
@pytest.mark.requires_opencl
def test_a_fusing_backend_keeps_the_chain_apart_and_calibrates_a_real_launch_cost(opencl_backend) -> None:
    """The OpenCL fuser merged the old Add chains into one kernel (0.0 us per node, thousands of GB/s)."""
    import numpy as np

    from edge_runtime.planning import micro_models
    from edge_runtime.planning.calibration import own_memory
    from edge_runtime.planning.calibration_bounds import (DEVICE_MEMORY_GBPS_MAX, HOST_BANDWIDTH_SLACK,
                                                          host_bandwidth_gbps)

    executable = opencl_backend.compile(micro_models.add_chain(16, 8), OPTIONS)
    try:
        feeds = {"x": np.arange(16, dtype=np.float32)}
        kernels = executable.profile(feeds, repeats=1)
        np.testing.assert_allclose(executable.run(feeds)["y"], 9 * feeds["x"])  # x + 8 more x
    finally:
        executable.close()
    assert len(kernels) == 8, f"one kernel per chain node, not fused: {[k['kernel'] for k in kernels]}"
    speed = measure_speed(opencl_backend, OPTIONS, on_host=False)
    assert speed.launch_us > 0, "a chain of k nodes costs more than one"
    host_bound = HOST_BANDWIDTH_SLACK * host_bandwidth_gbps()
    # PoCL (CI) reads the host's memory; a discrete GPU its own, held to the device ceiling
    assert 0 < speed.mem_gbps <= (DEVICE_MEMORY_GBPS_MAX if own_memory(opencl_backend) else host_bound)
    assert speed.copy_gbps is not None and 0 < speed.copy_gbps <= HOST_BANDWIDTH_SLACK * host_bandwidth_gbps()
    assert speed.stage_us >= 0 and speed.copy_latency_us >= 0


def test_figures_out_of_bounds_are_measured_again_then_refused_by_name(monkeypatch, caplog) -> None:
    from edge_runtime.planning import calibration

    sane = {"gflops": 50.0, "mem_gbps": 5.0, "launch_us": 2.0, "stage_us": 10.0, "copy_gbps": None,
            "copy_latency_us": 0.0, "conv_gflops": 40.0}
    passes = [{**sane, "launch_us": 0.0, "mem_gbps": 3813.0},  # what the fused chains gave
              {**sane, "launch_us": 0.0, "mem_gbps": 6.0}]    # again: bandwidth sane now, launch still 0
    monkeypatch.setattr(calibration, "_measure_figures", lambda *args: dict(passes.pop(0)))
    monkeypatch.setattr(calibration, "host_bandwidth_gbps", lambda elements: 50.0)
    with caplog.at_level(logging.INFO, logger="edge_runtime.planning.calibration"):
        speed = measure_speed(CPUBackend(), OPTIONS, on_host=True)
    assert passes == [], "measured exactly twice"
    assert speed.mem_gbps == 6.0, "the second measurement stands where it is in bounds"
    assert speed.launch_us == default_speed("cpu", on_host=True).launch_us
    assert speed.gflops == 50.0 and speed.conv_gflops == 40.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "refusing figure launch_us" in warnings[0], warnings


def test_bandwidth_beyond_the_host_is_refused(monkeypatch, caplog) -> None:
    from edge_runtime.planning import calibration

    impossible = {"gflops": 50.0, "mem_gbps": 210.0, "launch_us": 2.0, "stage_us": 10.0, "copy_gbps": 400.0,
                  "copy_latency_us": 5.0, "conv_gflops": None}
    monkeypatch.setattr(calibration, "_measure_figures", lambda *args: dict(impossible))
    monkeypatch.setattr(calibration, "host_bandwidth_gbps", lambda elements: 59.0)
    with caplog.at_level(logging.WARNING):
        speed = measure_speed(CPUBackend(), OPTIONS, on_host=False)
    defaults = default_speed("cpu", on_host=False)
    assert (speed.mem_gbps, speed.copy_gbps) == (defaults.mem_gbps, defaults.copy_gbps)
    assert "refusing figure mem_gbps" in caplog.text and "refusing figure copy_gbps" in caplog.text
    assert "59.0 GB/s" in caplog.text


def test_a_cached_impossible_figure_is_measured_again(tmp_path: Path, caplog) -> None:
    from edge_runtime.planning.calibration import _FORMAT

    (tmp_path / CACHE_FILE).write_text(json.dumps({f"cpu|k|v{_FORMAT}": {
        "backend": "cpu", "gflops": 50.0, "mem_gbps": 3813.0, "launch_us": 0.0, "stage_us": 1.0}}))
    with caplog.at_level(logging.WARNING):
        speed = cached_speed(CPUBackend(), "k", tmp_path, OPTIONS, True,
                             lambda b, o, h: measure_speed(b, o, h, budget_s=0.3))
    assert "unusable" in caplog.text and "launch_us" in caplog.text
    assert speed.launch_us > 0 and speed.mem_gbps < 3813.0


def test_a_device_with_its_own_memory_may_read_it_faster_than_the_host(monkeypatch, caplog) -> None:
    """A discrete GPU (an H200's OpenCL read 2.6 TB/s where the host moved 29.5 GB/s) keeps its bandwidth;
    its copies to the host keep the host's bound, and a shared-memory device keeps both."""
    from edge_runtime.planning import calibration
    from edge_runtime.planning.calibration_bounds import DEVICE_MEMORY_GBPS_MAX

    fast = {"gflops": 900.0, "mem_gbps": 2630.0, "launch_us": 6.0, "stage_us": 0.0, "copy_gbps": 12.0,
            "copy_latency_us": 37.0, "conv_gflops": 370.0}
    monkeypatch.setattr(calibration, "_measure_figures", lambda *args: dict(fast))
    monkeypatch.setattr(calibration, "host_bandwidth_gbps", lambda elements: 29.5)

    class Discrete(CPUBackend):
        def own_memory(self) -> bool:
            return True

    with caplog.at_level(logging.WARNING):
        speed = measure_speed(Discrete(), OPTIONS, on_host=False)
    assert speed.mem_gbps == 2630.0 and speed.copy_gbps == 12.0 and caplog.text == ""
    with caplog.at_level(logging.WARNING):
        shared = measure_speed(CPUBackend(), OPTIONS, on_host=False)
    assert shared.mem_gbps == default_speed("cpu", on_host=False).mem_gbps
    assert "refusing figure mem_gbps (2630 exceeds 2 x the host's 29.5 GB/s" in caplog.text
    monkeypatch.setattr(calibration, "_measure_figures",
                        lambda *args: {**fast, "mem_gbps": 2 * DEVICE_MEMORY_GBPS_MAX, "copy_gbps": 400.0})
    impossible = measure_speed(Discrete(), OPTIONS, on_host=False)
    defaults = default_speed("cpu", on_host=False)
    assert (impossible.mem_gbps, impossible.copy_gbps) == (defaults.mem_gbps, defaults.copy_gbps)


@pytest.mark.requires_opencl
def test_pocl_shares_the_host_s_memory(opencl_backend) -> None:
    from backends.opencl.device import probe_device
    from edge_runtime.planning.calibration import own_memory

    info = probe_device()
    if info.kind == "cpu":  # PoCL, the CI device: the host's own memory
        assert info.host_unified and own_memory(opencl_backend) is False
    else:  # a GPU: the calibration follows what the driver says
        assert own_memory(opencl_backend) is (not info.host_unified)
