"""Suite-wide fixtures and hardware markers.

``requires_opencl`` / ``requires_litert`` / ``requires_vulkan`` /
``requires_ncnn`` (ncnn + pnnx) / ``requires_ncnn_vulkan`` (ncnn sees a Vulkan
device) skip where the device has no such thing — except under ``CI=true``,
where CI installs PoCL, lavapipe, LiteRT, ncnn and pnnx, and a missing one
must fail the suite, not skip it.

Under ``CI=true`` every other skip fails too (``pytest_runtest_makereport``),
unless its test is on ``CI_SKIP_ALLOWLIST`` with the reason it may skip there.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
from pathlib import Path
from typing import Any

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
def _vulkan_reason() -> str | None:
    try:
        import onnxruntime_ep_webgpu  # noqa: F401
    except ImportError as exc:
        return f"onnxruntime-ep-webgpu not installed ({exc})"
    from device_profiles.vulkan_loader import query_devices

    devices, note = query_devices()
    if devices is None:
        return note
    return None if devices else "the Vulkan loader lists no device (install mesa-vulkan-drivers >= 25)"


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


_HARDWARE = {"requires_opencl": _opencl_reason, "requires_litert": _litert_reason, "requires_vulkan": _vulkan_reason,
             "requires_ncnn": _ncnn_reason, "requires_ncnn_vulkan": _ncnn_vulkan_reason}


def pytest_configure(config: pytest.Config) -> None:
    # One Mesa shader cache for the whole session (set before any Vulkan driver loads): the
    # first compile of a model's shaders takes 15-30 s on lavapipe, a cached one ~0.1 s.
    shaders = os.environ.get("EDGE_RUNTIME_TEST_VULKAN_CACHE") or str(Path(
        os.environ.get("TMPDIR", "/tmp")) / f"edge-runtime-test-shaders-{os.getuid()}")
    os.environ.setdefault("MESA_SHADER_CACHE_DIR", shaders)
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


# Test node ids (or their prefixes) that may skip under CI=true, each with the reason. Keep it short:
# a skip hides a test; an entry says why that is honest on the machine CI runs on.
CI_SKIP_ALLOWLIST: dict[str, str] = {
    "tests/device_profiles/test_device_probe.py::test_this_machine_is_the_dev_box":
        "describes an x86-64 Linux host; on another architecture (the aarch64 job) it does not apply",
}


def _allowed_ci_skip(nodeid: str) -> str | None:
    return next((why for prefix, why in CI_SKIP_ALLOWLIST.items() if nodeid.startswith(prefix)), None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """Under CI=true, a skip not on ``CI_SKIP_ALLOWLIST`` is reported as a failure naming its reason."""
    outcome = yield
    report = outcome.get_result()
    if not IN_CI or not report.skipped or hasattr(report, "wasxfail") or _allowed_ci_skip(item.nodeid):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"skipped under CI=true ({reason}); a skip hides this test: make it run in CI, or add "
                       f"{item.nodeid!r} to CI_SKIP_ALLOWLIST in tests/conftest.py with the reason")


TEST_CPU_CORES = 2  # every test sees this many cores, so the suite behaves the same on 2 and on 64


@pytest.fixture(autouse=True)
def pinned_cpu_cores(monkeypatch: pytest.MonkeyPatch) -> int:
    """Device workers sized without an explicit core count get ``TEST_CPU_CORES`` (one cpu run slot)."""
    from edge_runtime.scheduler import workers

    monkeypatch.setattr(workers.os, "cpu_count", lambda: TEST_CPU_CORES)
    return TEST_CPU_CORES


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache directory, also exported as EDGE_RUNTIME_CACHE."""
    path = tmp_path / "cache"
    monkeypatch.setenv("EDGE_RUNTIME_CACHE", str(path))
    return path
