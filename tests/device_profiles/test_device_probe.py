"""probe() + match() on fake phones, containers and this machine itself."""

from __future__ import annotations

import json
import math
import os
import platform

import pytest

import device_trees as trees
from device_profiles import match, probe
from device_profiles.load import read_gpu_busy


def _probe_and_match(root):
    profile = probe(root)
    json.dumps(profile, allow_nan=False)  # the contract: JSON-serialisable as is
    return profile, match(profile)


@pytest.mark.aarch64
def test_adreno_phone(tmp_path):
    profile, m = _probe_and_match(trees.adreno_phone(tmp_path))

    assert (profile["os"], profile["arch"]) == ("android", "aarch64")
    assert profile["kernel"].startswith("5.10.136-android12")
    android = profile["android"]
    assert (android["release"], android["sdk"], android["model"], android["platform"]) == ("13", 33, "SM-S901B", "taro")
    assert android["is_emulator"] is False
    cpu = profile["cpu"]
    assert (cpu["logical_cores"], cpu["online_cores"], cpu["usable_cores"]) == (8, 8, 8)
    assert cpu["clusters"] == [{"cpus": [0, 1, 2, 3], "max_freq_khz": 1785600},
                               {"cpus": [4, 5, 6], "max_freq_khz": 2496000},
                               {"cpus": [7], "max_freq_khz": 2995200}]
    # asimd -> neon, asimddp -> dotprod, fphp/asimdhp -> fp16; i8mm and bf16 as named
    assert cpu["features"] == ["bf16", "dotprod", "fp16", "i8mm", "neon"]
    assert cpu["model_name"] == "4x Cortex-A510 + 3x Cortex-A710 + 1x Cortex-X2"
    assert profile["memory"]["total_bytes"] == 12 * trees.GIB
    assert profile["memory"]["usable_bytes"] == 12 * trees.GIB
    assert profile["gpu"]["vendor"] == "adreno" and profile["gpu"]["name"] == "Adreno730v2"

    opencl = profile["opencl"]
    assert opencl["source"] == "libraries" and opencl["libraries"] == ["/vendor/lib64/libOpenCL.so"]
    [device] = opencl["devices"]
    assert (device["type"], device["software"], device["vendor"]) == ("gpu", False, "Qualcomm")
    assert opencl["icd_hint"] == "OCL_ICD_FILENAMES=/vendor/lib64/libOpenCL.so"
    assert profile["tflite_delegates"] == [{"path": "/vendor/lib64/libhexagon_delegate.so", "kind": "hexagon"}]
    assert profile["container"]["in_container"] is False  # /dev/binder alone is not container evidence
    assert profile["container"]["weak_markers"] == ["device /dev/binder"]

    source = profile["load_sources"]["gpu_busy"]
    assert source == {"path": "/sys/class/kgsl/kgsl-3d0/gpubusy", "kind": "kgsl_gpubusy"}
    assert read_gpu_busy(tmp_path, source) == pytest.approx(1200 / 4000)

    assert m.name == "adreno-phone"
    assert m.backend_order == ("opencl", "tflite", "cpu")
    assert any("gpu_vendor is 'adreno'" in r for r in m.reasons)
    assert m.hints["thresholds"]["gpu_busy_threshold"] == 0.7


@pytest.mark.aarch64
def test_mali_phone_with_vulkan_delegate(tmp_path):
    profile, m = _probe_and_match(trees.mali_phone(tmp_path))

    assert profile["gpu"]["vendor"] == "mali"
    assert profile["cpu"]["features"] == ["dotprod", "fp16", "neon"]
    assert [len(c["cpus"]) for c in profile["cpu"]["clusters"]] == [4, 2, 2]
    assert profile["opencl"]["devices"][0]["vendor"] == "ARM"
    assert {"path": "/vendor/lib64/libvulkan_delegate.so", "kind": "vulkan"} in profile["tflite_delegates"]
    source = profile["load_sources"]["gpu_busy"]
    assert source == {"path": "/sys/devices/platform/1c500000.mali/utilization", "kind": "mali_utilization"}
    assert read_gpu_busy(tmp_path, source) == pytest.approx(0.55)

    assert m.name == "mali-phone"
    assert m.backend_order == ("tflite", "opencl", "cpu")
    assert m.hints["delegate"]["library"] == "/vendor/lib64/libvulkan_delegate.so"
    assert m.hints["delegate"]["present"] is True


@pytest.mark.aarch64
def test_mali_phone_without_delegate_prefers_opencl(tmp_path):
    profile, m = _probe_and_match(trees.mali_phone(tmp_path, delegate=False))

    assert m.name == "mali-phone"
    assert m.backend_order == ("opencl", "tflite", "cpu")
    assert m.hints["delegate"]["present"] is False
    assert any("libvulkan_delegate.so not found" in r for r in m.reasons)


@pytest.mark.aarch64
def test_mali_phone_without_opencl_or_delegate(tmp_path):
    profile, m = _probe_and_match(trees.mali_phone(tmp_path, delegate=False, opencl=False))

    assert profile["opencl"]["devices"] == [] and profile["opencl"]["source"] == "none"
    assert m.name == "mali-phone"  # still a Mali phone: /sys/class/misc/mali0
    assert m.backend_order == ("tflite", "cpu")
    assert any("opencl dropped" in r for r in m.reasons)


@pytest.mark.aarch64
def test_redroid_container_cgroup_v2_quota(tmp_path):
    profile, m = _probe_and_match(trees.redroid_container(tmp_path))

    cpu, memory, cgroup = profile["cpu"], profile["memory"], profile["cgroup"]
    assert (cpu["logical_cores"], cpu["online_cores"]) == (64, 64)
    assert cgroup["version"] == 2 and cgroup["cpu_quota_cores"] == 2.0
    assert cpu["usable_cores"] == 2
    assert memory["limit_bytes"] == 4 * trees.GIB and memory["usable_bytes"] == 4 * trees.GIB
    assert memory["total_bytes"] == 256 * trees.GIB
    assert memory["available_bytes"] == 3 * trees.GIB  # limit minus memory.current
    container = profile["container"]
    assert container["in_container"] is True
    assert "file /.dockerenv" in container["markers"]
    assert "android prop ro.product.model=redroid13_arm64" in container["markers"]
    assert profile["gpu"]["vendor"] is None and profile["gpu"]["software_only"] is True
    assert profile["vulkan"]["devices"] == [{"name": "vulkan.pastel", "type": "cpu", "software": True,
                                             "driver": "/vendor/lib64/hw/vulkan.pastel.so"}]

    assert m.name == "cloud-phone-container"
    assert m.backend_order == ("tflite", "cpu")
    assert any("usable_cores <= 4 (probe: 2)" in r for r in m.reasons)


@pytest.mark.aarch64
def test_redroid_quota_in_own_cgroup_and_tightest_ancestor(tmp_path):
    root = trees.redroid_container(tmp_path, own_path="/docker/abc123", cpu_max="150000 100000")
    trees.write(root, "/sys/fs/cgroup/docker/cpu.max", "400000 100000\n")
    trees.write(root, "/sys/fs/cgroup/cpu.max", "max 100000\n")
    profile = probe(root)
    assert profile["cgroup"]["path"] == "/docker/abc123"
    assert profile["cgroup"]["cpu_quota_cores"] == 1.5
    assert profile["cpu"]["usable_cores"] == math.ceil(1.5)

    trees.write(root, "/sys/fs/cgroup/docker/cpu.max", "100000 100000\n")  # a tighter parent binds too
    assert probe(root)["cpu"]["usable_cores"] == 1


@pytest.mark.aarch64
def test_same_container_without_quota_is_not_the_small_cloud_phone(tmp_path):
    profile, m = _probe_and_match(trees.redroid_container(tmp_path, cpu_max="max 100000", memory_max="max"))

    assert profile["cgroup"]["cpu_quota_cores"] is None and profile["memory"]["limit_bytes"] is None
    assert profile["cpu"]["usable_cores"] == 64
    assert m.name == "generic-arm64-android"
    assert any(r.startswith("not cloud-phone-container") and "usable_cores <= 4 (probe: 64)" in r
               for r in m.reasons)
    assert m.backend_order == ("tflite", "cpu")


@pytest.mark.parametrize(("quota_us", "memory_limit", "quota", "usable", "limit"), [
    (150000, 3 * trees.GIB, 1.5, 2, 3 * trees.GIB),
    (-1, 9223372036854771712, None, 64, None),  # v1 writes "no limit" as -1 and a huge number
])
@pytest.mark.aarch64
def test_redroid_container_cgroup_v1(tmp_path, quota_us, memory_limit, quota, usable, limit):
    root = trees.cgroup_v1(trees.redroid_container(tmp_path, cgroup="v1"), quota_us=quota_us,
                           period_us=100000, memory_limit=memory_limit)
    profile, m = _probe_and_match(root)

    assert profile["cgroup"]["version"] == 1
    assert profile["cgroup"]["cpu_quota_cores"] == quota
    assert profile["cpu"]["usable_cores"] == usable
    assert profile["memory"]["limit_bytes"] == limit
    assert m.name == ("cloud-phone-container" if usable <= 4 else "generic-arm64-android")


@pytest.mark.aarch64
def test_cloud_phone_with_virtual_gpu(tmp_path):
    profile, m = _probe_and_match(trees.vgpu_phone(tmp_path))

    assert profile["gpu"]["vendor"] == "virtio" and profile["gpu"]["virtual"] is True
    assert profile["vulkan"]["devices"][0]["type"] == "virtual_gpu"
    assert m.name == "cloud-phone-vgpu"
    # no OpenCL device: dropped; no GPU delegate library: tflite moved down to just before cpu
    assert m.backend_order == ("vulkan", "tflite", "cpu")


@pytest.mark.aarch64
def test_cloud_phone_with_virtual_gpu_and_delegate(tmp_path):
    profile, m = _probe_and_match(trees.vgpu_phone(tmp_path, delegate=True))
    assert m.name == "cloud-phone-vgpu"
    assert m.backend_order == ("vulkan", "tflite", "cpu")  # venus/virtio: the vulkan backend first
    assert m.hints["delegate"]["present"] is True


@pytest.mark.aarch64
def test_fake_x86_dev_box_with_pocl_icd(tmp_path):
    profile, m = _probe_and_match(trees.x86_dev_box(tmp_path))

    assert (profile["os"], profile["arch"]) == ("linux", "x86_64")
    assert profile["cpu"]["features"] == ["avx", "avx2", "avx512f", "f16c", "fma", "sse4_2"]
    assert profile["cpu"]["model_name"] == "Example CPU @ 3.0GHz"
    opencl = profile["opencl"]
    assert opencl["source"] == "libraries" and opencl["icd_hint"] is None
    assert [(d["type"], d["software"]) for d in opencl["devices"]] == [("cpu", True)]  # PoCL: never a GPU
    assert profile["gpu"]["vendor"] is None
    assert m.name == "x86_64-linux-dev"
    assert m.backend_order == ("cpu", "tflite", "opencl")  # vulkan dropped: no device


needs_x86_linux = pytest.mark.skipif(platform.machine() != "x86_64" or platform.system() != "Linux",
                                     reason="the x86_64-linux-dev entry describes x86-64 Linux hosts")


@needs_x86_linux
def test_this_machine_is_the_dev_box():
    profile, m = _probe_and_match("/")

    assert (profile["os"], profile["arch"]) == ("linux", "x86_64")
    assert 1 <= profile["cpu"]["usable_cores"] <= len(os.sched_getaffinity(0))
    assert m.name == "x86_64-linux-dev"
    assert m.backend_order[0] == "cpu"  # software OpenCL/Vulkan never beat ORT by default
    assert all(not (d["type"] == "gpu" and d["software"]) for d in profile["opencl"]["devices"])


@needs_x86_linux
@pytest.mark.requires_opencl
def test_this_machine_reports_pocl_as_software_cpu():
    import pyopencl as cl

    profile, m = _probe_and_match("/")
    by_name = {d["name"]: d for d in profile["opencl"]["devices"]}
    oracle = [(p.name, d) for p in cl.get_platforms() for d in p.get_devices()]
    assert profile["opencl"]["source"] == "pyopencl"
    assert len(by_name) == len(oracle)
    for platform_name, device in oracle:
        mine = by_name[device.name.strip()]
        assert mine["compute_units"] == device.max_compute_units
        # PoCL sizes its global memory from the host memory it sees when the driver starts in a
        # process, and that moves: two clinfo runs seconds apart read 4600424448 and 4701087744
        # here, and CI saw the probe's child and this process differ by 128 MiB. Another field
        # (max alloc, local memory) or another unit would be off by far more than 10 %.
        assert mine["global_mem_bytes"] == pytest.approx(device.global_mem_size, rel=0.10)
        if "Portable Computing Language" in platform_name:
            assert (mine["type"], mine["software"]) == ("cpu", True)
    assert "opencl" in m.backend_order  # a software device keeps the backend for tests and --backend
