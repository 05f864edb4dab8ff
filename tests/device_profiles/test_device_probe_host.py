"""probe("/") on whatever machine runs the suite — x86_64 here, arm64 in .ci/aarch64 — and the
aarch64 auxiliary vector, the source of CPU features that also holds under emulation.

Oracles: ``platform.machine()``, the affinity mask, libc's ``getauxval`` (through ctypes,
not the probe's reading of ``/proc/self/auxv``) and the raw ``/proc/cpuinfo`` text.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import struct

import pytest

import device_trees as trees
from device_profiles import match, probe

# The kernel's uapi asm/hwcap.h for arm64, written out here as the oracle's table.
HWCAP_NAMES = {"neon": 1 << 1, "fp16": 1 << 9, "dotprod": 1 << 20, "sve": 1 << 22}
HWCAP2_NAMES = {"sve2": 1 << 1, "i8mm": 1 << 13, "bf16": 1 << 14, "sme": 1 << 23}
AT_HWCAP, AT_HWCAP2 = 16, 26


def _auxv(hwcap: int, hwcap2: int) -> bytes:
    return struct.pack("<8Q", 6, 4096, AT_HWCAP, hwcap, AT_HWCAP2, hwcap2, 0, 0)  # AT_PAGESZ, ..., AT_NULL


@pytest.mark.aarch64
def test_this_machine_reports_its_own_architecture_cores_and_features() -> None:
    profile = probe("/")
    json.dumps(profile, allow_nan=False)
    machine = platform.machine().lower()
    assert profile["arch"] == {"arm64": "aarch64", "amd64": "x86_64"}.get(machine, machine)
    assert 1 <= profile["cpu"]["usable_cores"] <= len(os.sched_getaffinity(0))
    features = profile["cpu"]["features"]
    if profile["arch"] == "aarch64":
        libc = ctypes.CDLL(None)
        libc.getauxval.restype = ctypes.c_ulong
        libc.getauxval.argtypes = [ctypes.c_ulong]
        hwcap, hwcap2 = libc.getauxval(AT_HWCAP), libc.getauxval(AT_HWCAP2)
        expected = {name for name, bit in HWCAP_NAMES.items() if hwcap & bit}
        expected |= {name for name, bit in HWCAP2_NAMES.items() if hwcap2 & bit}
        assert set(features) == expected
        assert "neon" in features  # every arm64 Linux CPU has Advanced SIMD
    else:
        with open("/proc/cpuinfo") as handle:
            flags = {w for line in handle if line.startswith("flags") for w in line.split(":", 1)[1].split()}
        assert set(features) <= flags
    assert match(profile).backend_order[-1] in ("cpu", "opencl", "vulkan", "tflite")


@pytest.mark.aarch64
def test_auxv_gives_the_features_where_cpuinfo_has_none(tmp_path) -> None:
    root = trees.adreno_phone(tmp_path)
    # A kernel whose /proc/cpuinfo lists no Features (some Android builds): only the auxv tells.
    cpuinfo = trees.arm_cpuinfo([0xD46] * 4 + [0xD47] * 3 + [0xD48], "")
    trees.write(root, "/proc/cpuinfo", "\n".join(line for line in cpuinfo.splitlines() if "Features" not in line))
    assert probe(root)["cpu"]["features"] == []
    (root / "proc" / "self").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "self" / "auxv").write_bytes(_auxv(1 << 1 | 1 << 10 | 1 << 20, 1 << 13))
    profile = probe(root)
    assert profile["cpu"]["features"] == ["dotprod", "fp16", "i8mm", "neon"]
    assert profile["arch"] == "aarch64" and profile["cpu"]["model_name"].startswith("4x Cortex-A510")


@pytest.mark.aarch64
def test_a_truncated_auxv_falls_back_to_cpuinfo(tmp_path) -> None:
    root = trees.adreno_phone(tmp_path)
    (root / "proc" / "self").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "self" / "auxv").write_bytes(_auxv(1 << 1, 0)[:-3])
    assert probe(root)["cpu"]["features"] == ["bf16", "dotprod", "fp16", "i8mm", "neon"]
