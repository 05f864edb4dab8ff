"""Fixtures for the optimisation tests: model files, and a Runtime whose cost model offloads to OpenCL.

``offloading_runtime`` uses the real OpenCL backend (PoCL in CI) with pinned
backend speeds — a host slow per node, an accelerator fast but paying for
copies — so the ``gpu``/``hybrid``/``auto`` plans put every float node OpenCL
claims on OpenCL and leave the quantized ops on the CPU: truly mixed plans,
whatever this machine's calibration would say.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "planning"))

from quant_models import conv_integer_model, small_cnn  # noqa: E402


@pytest.fixture(scope="session")
def cnn_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("optimize") / "cnn.onnx"
    onnx.save(small_cnn(), str(path))
    return path


@pytest.fixture(scope="session")
def conv_integer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("optimize") / "conv_integer.onnx"
    onnx.save(conv_integer_model(), str(path))
    return path


@pytest.fixture(scope="module")
def cpu_runtime(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A Runtime with no accelerator (probe_opencl off), 2 threads."""
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    rt = Runtime(RuntimeConfig(cache_dir=tmp_path_factory.mktemp("cache"), intra_op_threads=2, probe_opencl=False))
    rt.accelerator = lambda: None  # type: ignore[method-assign]
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def offloading_runtime(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from planning_fakes import HOST_SPEED, accel_speed

    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    rt = Runtime(RuntimeConfig(cache_dir=tmp_path_factory.mktemp("cache"), intra_op_threads=2))
    if rt.accelerator() != "opencl":
        reason = f"no usable OpenCL backend: {rt.availability('opencl').reason}"
        rt.close()
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason} (CI=true: this must run, not skip)")
        pytest.skip(reason)
    speeds = {"cpu": HOST_SPEED, "opencl": accel_speed("opencl")}
    rt.backend_speed = lambda name: speeds[name]  # type: ignore[method-assign]
    # The split is what is tested: plan 'auto' keeps the partitioner's layout instead of racing it
    # against cpu (the race, with real speeds, is tested in tests/planning/test_auto_*.py).
    rt.measured_choice = lambda *args, **kwargs: None  # type: ignore[method-assign]
    yield rt
    rt.close()
