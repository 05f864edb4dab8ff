"""Warm starts of the OpenCL backend beyond test_opencl_caches: a driver upgrade and an unwritable cache.

Assertions are on the backend's counters (builds, hits), never on time.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from backends.base import CompileOptions
from tests.backends.model_helpers import assert_close, make_model, ort_outputs, rand, tensor

pytestmark = pytest.mark.requires_opencl


def _model(n: int = 80):
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    return make_model(nodes, [tensor("a", [n, n])], [tensor("y", None)], {"w": rand(rng, n, n)}, name="warm80")


def _backend(cache_dir: Path):
    from backends.opencl import OpenCLBackend

    return OpenCLBackend(cache_dir=cache_dir, tune=True, tune_min_flops=1e5)


def test_a_driver_upgrade_misses_binaries_and_tuning(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from backends.opencl.device import DeviceInfo

    model, feeds = _model(), {"a": rand(np.random.default_rng(1), 80, 80)}
    first = _backend(cache_dir)
    first.compile(model, CompileOptions()).run(feeds)
    warm = _backend(cache_dir)
    warm.compile(model, CompileOptions()).run(feeds)
    assert warm.stats.program_builds == 0 and warm.stats.binary_hits >= 1 and warm.stats.tuning_hits >= 1
    identity = DeviceInfo.cache_identity.fget
    monkeypatch.setattr(DeviceInfo, "cache_identity", property(lambda info: identity(info) + "|driver-upgraded"))
    upgraded = _backend(cache_dir)
    out = upgraded.compile(model, CompileOptions()).run(feeds)
    assert upgraded.stats.binary_hits == 0 and upgraded.stats.program_builds >= 1
    assert upgraded.stats.tuning_hits == 0 and upgraded.stats.tuning_measured >= 1
    assert_close(out["y"], ort_outputs(model, feeds)[0])


def test_an_unwritable_cache_is_ignored_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "cache-is-a-file"
    blocker.write_text("not a directory")
    model, feeds = _model(), {"a": rand(np.random.default_rng(2), 80, 80)}
    with caplog.at_level(logging.WARNING, logger="backends.opencl"):
        out = _backend(blocker).compile(model, CompileOptions()).run(feeds)
    assert_close(out["y"], ort_outputs(model, feeds)[0])
    assert "cannot write" in caplog.text
