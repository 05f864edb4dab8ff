"""A garbled, partial or hostile tree never makes the probe raise, and never reaches the host."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import types

import pytest

import device_trees as trees
from device_profiles import match, probe
from device_profiles.android import parse_getprop
from device_profiles.report import format_profile
from device_profiles.vulkan import parse_vulkaninfo_summary


def _files(root):
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_empty_root(tmp_path):
    profile = probe(tmp_path)
    json.dumps(profile, allow_nan=False)
    assert (profile["os"], profile["arch"], profile["android"]) == ("linux", None, None)
    assert profile["cpu"]["usable_cores"] == 1
    assert profile["opencl"]["source"] == "none" and profile["cgroup"]["version"] is None
    assert match(profile).name == "generic"


def test_random_bytes_in_every_file(tmp_path):
    root = trees.redroid_container(trees.adreno_phone(tmp_path / "phone"))
    rng = random.Random(1234)
    for path in _files(root):
        path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))))
    profile = probe(root)
    json.dumps(profile, allow_nan=False)
    assert profile["cpu"]["usable_cores"] >= 1
    assert match(profile).reasons


@pytest.mark.parametrize(("path", "text"), [
    ("/sys/fs/cgroup/cpu.max", "lots 100000"), ("/sys/fs/cgroup/cpu.max", "0 0"),
    ("/sys/fs/cgroup/cpu.max", "-5 100000"), ("/sys/fs/cgroup/memory.max", "-1"),
    ("/sys/devices/system/cpu/online", "9-3"), ("/sys/devices/system/cpu/online", "0-99999999"),
    ("/proc/cpuinfo", "processor : x\nFeatures : \n"), ("/proc/meminfo", "MemTotal: lots kB\n"),
    ("/proc/self/cgroup", "garbage\n::\n0::relative\n"),
    ("/sys/class/thermal/thermal_zone0/temp", "hot\n"), ("/system/build.prop", "=\n==\nro.build.version.sdk=abc\n"),
])
def test_garbage_values_read_as_unknown(tmp_path, path, text):
    root = trees.redroid_container(tmp_path)
    trees.write(root, path, text)
    profile = probe(root)
    json.dumps(profile, allow_nan=False)
    assert profile["cpu"]["usable_cores"] >= 1
    assert match(profile).name


def test_directories_fifos_and_dangling_links_in_place_of_files(tmp_path):
    root = trees.adreno_phone(tmp_path)
    for device_path in ("/proc/meminfo", "/sys/class/kgsl/kgsl-3d0/gpubusy"):
        (root / device_path.lstrip("/")).unlink()
        (root / device_path.lstrip("/")).mkdir()
    (root / "proc/cpuinfo").unlink()
    os.mkfifo(root / "proc/cpuinfo")  # opening a FIFO would block: it must be skipped
    (root / "system/build.prop").unlink()
    (root / "system/build.prop").symlink_to(root / "nowhere")
    profile = probe(root)
    json.dumps(profile, allow_nan=False)
    assert profile["memory"]["total_bytes"] is None
    assert profile["cpu"]["features"] == []
    assert profile["os"] == "android"  # /vendor/build.prop still says so


def test_fake_tree_never_asks_the_host(tmp_path, monkeypatch):
    root = trees.adreno_phone(tmp_path)
    expected = probe(root)

    def refuse(*args, **kwargs):
        raise AssertionError(f"a fake tree must not reach the host: {args!r}")

    fake_cl = types.ModuleType("pyopencl")
    fake_cl.get_platforms = refuse
    monkeypatch.setitem(sys.modules, "pyopencl", fake_cl)
    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(os, "sched_getaffinity", refuse)
    monkeypatch.setattr(os, "cpu_count", refuse)
    monkeypatch.setattr("platform.machine", refuse)
    assert probe(root) == expected


def test_report_text(tmp_path):
    profile = probe(trees.adreno_phone(tmp_path))
    text = format_profile(profile, match(profile))
    assert "profile:    adreno-phone; backends opencl > tflite > cpu" in text
    assert "8 logical, 8 online, 8 usable" in text
    assert "OCL_ICD_FILENAMES=/vendor/lib64/libOpenCL.so" in text
    assert "gpu busy /sys/class/kgsl/kgsl-3d0/gpubusy (kgsl_gpubusy)" in text
    assert format_profile(probe(tmp_path / "empty"), None).startswith("device:     unknown arch linux")


def test_parse_getprop_output():
    text = "[ro.build.version.sdk]: [34]\n[ro.product.model]: [Pixel 7]\nnoise\n[empty]: []\n"
    assert parse_getprop(text) == {"ro.build.version.sdk": "34", "ro.product.model": "Pixel 7", "empty": ""}


def test_parse_vulkaninfo_summary():
    text = ("Devices:\n========\nGPU0:\n\tapiVersion         = 1.3.230\n"
            "\tdeviceType         = PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU\n\tdeviceName         = Mali-G710\n"
            "\tdriverName         = Mali\nGPU1:\n\tdeviceType         = PHYSICAL_DEVICE_TYPE_CPU\n"
            "\tdeviceName         = llvmpipe (LLVM 15.0.6, 256 bits)\n\tdriverName         = llvmpipe\n")
    assert parse_vulkaninfo_summary(text) == [
        {"name": "Mali-G710", "type": "integrated_gpu", "software": False, "driver": "Mali"},
        {"name": "llvmpipe (LLVM 15.0.6, 256 bits)", "type": "cpu", "software": True, "driver": "llvmpipe"},
    ]
