"""Suite-wide fixtures and hardware markers.

``requires_opencl`` / ``requires_litert`` / ``requires_vulkan`` skip where the
device has no such thing — except under ``CI=true``, where CI installs PoCL,
lavapipe and LiteRT, and a missing one must fail the suite, not skip it.
"""

from __future__ import annotations

import functools
import os
import platform
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


_HARDWARE = {"requires_opencl": _opencl_reason, "requires_litert": _litert_reason}


def pytest_configure(config: pytest.Config) -> None:
    for marker in _HARDWARE:
        config.addinivalue_line("markers", f"{marker}: needs that runtime; fails instead of skipping under CI=true")
    _Aarch64Stage.register(config)


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


# --- aarch64: the subset .ci/aarch64 runs again in an emulated arm64 root ------------------
# The same tests, marked, not copies. On an arm64 host a skip of a marked test is a failure:
# that stage exists to run them there, and a dependency missing from the arm64 root must
# fail it. A plugin object, so that its hook does not share a name with other conftest hooks.
class _Aarch64Stage:
    on_aarch64 = platform.machine().lower() in ("aarch64", "arm64")

    @staticmethod
    def register(config: pytest.Config) -> None:
        config.addinivalue_line("markers", "aarch64: also runs under arm64 emulation in .ci/aarch64; "
                                           "a skip there is a failure")
        config.pluginmanager.register(_Aarch64Stage(), "edge-runtime-aarch64-stage")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report = outcome.get_result()
        if self.on_aarch64 and report.skipped and not hasattr(report, "wasxfail") \
                and item.get_closest_marker("aarch64") is not None:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
            report.outcome = "failed"
            report.longrepr = f"skipped on aarch64, where .ci/aarch64 must run it: {reason}"
# --- end aarch64 ---------------------------------------------------------------------------


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache directory, also exported as EDGE_RUNTIME_CACHE."""
    path = tmp_path / "cache"
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(path))
    return path
