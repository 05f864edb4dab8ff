"""Fixtures for planning tests: planners over the cpu backend and a refusing accelerator.

The accelerator is either the cpu backend behind ``RefusingBackend`` (runs
everywhere) or the real OpenCL backend behind it (``opencl_backend``; tests
using it carry ``requires_opencl``, and fail rather than skip under CI=true
when the backend cannot be built).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from planning_fakes import HOST_SPEED, RefusingBackend, accel_speed  # noqa: E402

IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="session")
def opencl_backend() -> Any:
    """The real OpenCL backend (PoCL in CI); skips locally, fails under CI=true, when unusable."""
    try:
        backend = importlib.import_module("backends.opencl").OpenCLBackend(cache_dir=None)
        availability = backend.availability()
        reason = None if availability.ok else availability.reason
    except (ImportError, AttributeError) as exc:
        reason = f"backends.opencl is not importable: {exc}"
    if reason is not None:
        if IN_CI:
            pytest.fail(f"OpenCL backend unusable under CI=true: {reason}")
        pytest.skip(reason)
    return backend


@pytest.fixture
def make_planner() -> Callable[..., Any]:
    """``make_planner(model, refuse_nodes=..., refuse_ops=..., inner=None)`` ->
    (Planner, accelerator RefusingBackend, host RefusingBackend over cpu)."""
    from backends.cpu import CPUBackend
    from edge_runtime.planning.plans import Planner

    def build(model: Any, *, refuse_nodes: tuple[str, ...] = (), refuse_ops: tuple[str, ...] = (),
              inner: Any = None, name: str = "restricted", input_shapes: Any = None) -> tuple[Any, Any, Any]:
        accel = RefusingBackend(inner or CPUBackend(), name, refuse_ops, refuse_nodes)
        host = RefusingBackend(CPUBackend(), "cpu")
        planner = Planner(model, {"cpu": host, name: accel}, {"cpu": HOST_SPEED, name: accel_speed(name)},
                          host="cpu", accelerator=name, input_shapes=input_shapes)
        return planner, accel, host

    return build


@pytest.fixture
def options(tmp_path: Path) -> Any:
    from backends.base import CompileOptions

    return CompileOptions(intra_op_threads=2, cache_dir=None)
