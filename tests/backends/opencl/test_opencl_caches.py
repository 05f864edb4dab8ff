"""On-disk caches (program binaries, tuning) and the driver canary.

Assertions are on the backend's counters, never on wall-clock time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from backends.base import CompileOptions
from backends.errors import BackendUnavailableError
from tests.backends.model_helpers import assert_close, make_model, ort_outputs, rand, tensor

pytestmark = pytest.mark.requires_opencl


def _gemm_model(seed: int = 0, n: int = 96):
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    return make_model(nodes, [tensor("a", [n, n])], [tensor("y", None)], {"w": rand(rng, n, n)}, name="gemm96")


def _backend(cache_dir: Path, **kwargs):
    from backends.opencl import OpenCLBackend

    return OpenCLBackend(cache_dir=cache_dir, **kwargs)


def test_binaries_are_cached_and_a_corrupt_file_is_rebuilt(cache_dir: Path) -> None:
    model = _gemm_model()
    feeds = {"a": rand(np.random.default_rng(1), 96, 96)}
    want = ort_outputs(model, feeds)[0]
    first = _backend(cache_dir, tune=False)
    assert_close(first.compile(model, CompileOptions()).run(feeds)["y"], want)
    assert first.stats.program_builds == 1
    binaries = list((cache_dir / "opencl" / "binaries").glob("*.bin"))
    assert len(binaries) == 1

    second = _backend(cache_dir, tune=False)  # a fresh process would look the same: nothing in memory
    assert_close(second.compile(model, CompileOptions()).run(feeds)["y"], want)
    assert (second.stats.binary_hits, second.stats.program_builds) == (1, 0)

    blob = binaries[0].read_bytes()
    binaries[0].write_bytes(blob[: len(blob) // 2])  # truncated, as by a crash mid-write
    third = _backend(cache_dir, tune=False)
    assert_close(third.compile(model, CompileOptions()).run(feeds)["y"], want)
    assert (third.stats.binary_rejected, third.stats.program_builds, third.stats.binary_hits) == (1, 1, 0)
    assert binaries[0].read_bytes() != blob[: len(blob) // 2]  # rewritten whole

    binaries[0].write_bytes(blob[:40] + bytes(b ^ 0xFF for b in blob[40:80]) + blob[80:])  # flipped bits
    fourth = _backend(cache_dir, tune=False)
    assert_close(fourth.compile(model, CompileOptions()).run(feeds)["y"], want)
    assert (fourth.stats.binary_rejected, fourth.stats.program_builds) == (1, 1)


def test_cache_key_extra_separates_binaries(cache_dir: Path) -> None:
    model = _gemm_model()
    _backend(cache_dir, tune=False).compile(model, CompileOptions(cache_key_extra="build-A"))
    other = _backend(cache_dir, tune=False)
    other.compile(model, CompileOptions(cache_key_extra="build-B"))
    assert (other.stats.binary_hits, other.stats.program_builds) == (0, 1)


def test_tuning_runs_once_and_is_reused_from_disk(cache_dir: Path) -> None:
    model = _gemm_model(n=160)
    feeds = {"a": rand(np.random.default_rng(2), 160, 160)}
    want = ort_outputs(model, feeds)[0]
    first = _backend(cache_dir, tune=True, tune_min_flops=1e6)
    executable = first.compile(model, CompileOptions())
    assert_close(executable.run(feeds)["y"], want)
    assert first.stats.tuning_measured == 1 and first.stats.tuning_hits == 0
    tuning = json.loads((cache_dir / "opencl" / "tuning.json").read_text())
    (entry,) = tuning.values()
    assert len(entry["times_us"]) >= 2 and 0 <= entry["choice"] < len(entry["times_us"])
    times = executable.describe()["specialisations"][0]["times_s"]
    assert set(times) == {"plan", "tune", "build"}

    second = _backend(cache_dir, tune=True, tune_min_flops=1e6)
    assert_close(second.compile(model, CompileOptions()).run(feeds)["y"], want)
    assert second.stats.tuning_measured == 0 and second.stats.tuning_hits == 1
    assert second.stats.binary_hits == 1 and second.stats.program_builds == 0


def test_small_kernels_are_not_tuned(cache_dir: Path) -> None:
    backend = _backend(cache_dir, tune=True, tune_min_flops=1e9)
    backend.compile(_gemm_model(), CompileOptions())
    assert backend.stats.tuning_measured == 0
    assert not (cache_dir / "opencl" / "tuning.json").exists()


@pytest.mark.parametrize("fault, reason, timeout_s", [
    ("crash", "SIGSEGV", 60.0), ("hang", "hung", 3.0), ("wrong", "differs from numpy", 60.0)])
def test_canary_failure_marks_the_device_unusable(fault: str, reason: str, timeout_s: float, cache_dir: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from backends.opencl.canary import FAULT_ENV

    monkeypatch.setenv(FAULT_ENV, fault)  # read only by the canary child process
    backend = _backend(cache_dir, canary_timeout_s=timeout_s)
    availability = backend.availability()
    assert not availability.ok and reason in availability.reason
    with pytest.raises(BackendUnavailableError, match=reason):
        backend.compile(_gemm_model(), CompileOptions())
    stored = json.loads((cache_dir / "opencl" / "canary.json").read_text())
    (verdict,) = stored.values()
    assert verdict["ok"] is False and reason in verdict["reason"]

    monkeypatch.delenv(FAULT_ENV)
    later = _backend(cache_dir)  # the verdict persists: no new canary, still unusable
    assert not later.availability().ok


def test_healthy_canary_is_recorded_once(cache_dir: Path) -> None:
    backend = _backend(cache_dir)
    assert backend.availability().ok
    stored = json.loads((cache_dir / "opencl" / "canary.json").read_text())
    (verdict,) = stored.values()
    assert verdict["ok"] is True
    assert _backend(cache_dir).availability().ok


def test_canary_module_runs_standalone() -> None:
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-m", "backends.opencl.canary"], cwd=root, capture_output=True,
                          text=True, timeout=120, check=False)
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0 and verdict["ok"] and verdict["relative_error"] < 1e-5
