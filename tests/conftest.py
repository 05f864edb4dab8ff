"""Suite-wide fixtures and hardware markers.

``requires_opencl`` / ``requires_litert`` / ``requires_vulkan`` /
``requires_ncnn`` (ncnn + pnnx) / ``requires_ncnn_vulkan`` (ncnn sees a Vulkan
device) skip where the device has no such thing — except under ``CI=true``,
where CI installs PoCL, lavapipe, LiteRT, ncnn and pnnx, and a missing one
must fail the suite, not skip it.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "tools") not in sys.path:
    sys.path.insert(0, str(ROOT / "tools"))

IN_CI = os.environ.get("CI", "").lower() == "true"


@functools.lru_cache(maxsize=None)
def _opencl_reason() -> str | None:
    try:
        import pyopencl as cl
    except ImportError as exc:
        return f"pyopencl not installed ({exc})"
    try:
        devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error as exc:
        return f"no OpenCL platform ({exc})"
    return None if devices else "no OpenCL device"


@functools.lru_cache(maxsize=None)
def _litert_reason() -> str | None:
    for module in ("ai_edge_litert.interpreter", "tflite_runtime.interpreter"):
        try:
            __import__(module)
            return None
        except ImportError:
            continue
    return "neither ai_edge_litert nor tflite_runtime is installed"


@functools.lru_cache(maxsize=None)
def _ncnn_reason() -> str | None:
    try:
        import ncnn  # noqa: F401
    except ImportError as exc:
        return f"ncnn not installed ({exc})"
    from backends.ncnn.convert import pnnx_binary

    return None if pnnx_binary() is not None else "pnnx not installed (pip install --no-deps pnnx)"


@functools.lru_cache(maxsize=None)
def _ncnn_vulkan_reason() -> str | None:
    reason = _ncnn_reason()
    if reason is not None:
        return reason
    from backends.ncnn.backend import vulkan_device_index

    return None if vulkan_device_index() is not None else "ncnn sees no Vulkan device (lavapipe not installed?)"


_HARDWARE = {"requires_opencl": _opencl_reason, "requires_litert": _litert_reason,
             "requires_ncnn": _ncnn_reason, "requires_ncnn_vulkan": _ncnn_vulkan_reason}


def pytest_configure(config: pytest.Config) -> None:
    for marker in _HARDWARE:
        config.addinivalue_line("markers", f"{marker}: needs that runtime; fails instead of skipping under CI=true")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker, reason_of in _HARDWARE.items():
        if item.get_closest_marker(marker) is None:
            continue
        reason = reason_of()
        if reason is None:
            continue
        if IN_CI:
            pytest.fail(f"{marker}: {reason} (CI=true: this must run, not skip)")
        pytest.skip(reason)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache directory, also exported as EDGE_RUNTIME_CACHE."""
    path = tmp_path / "cache"
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(path))
    return path
