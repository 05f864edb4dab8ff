"""Vulkan facts on fake trees and on this machine: devices classified, software never a GPU."""

from __future__ import annotations

import pytest

from device_profiles import match, probe
from device_profiles.vulkan import classify_loader_devices
from tests.device_profiles import device_trees as trees


def test_virtio_gpu_cloud_phone_chooses_vulkan_and_has_drm(tmp_path):
    profile = probe(trees.vgpu_phone(tmp_path))
    assert [(d["type"], d["software"]) for d in profile["vulkan"]["devices"]] == [("virtual_gpu", False)]
    assert profile["vulkan"]["drm"] == {"present": True, "cards": ["card0"], "drivers": ["virtio_gpu"]}
    assert match(profile).backend_order[0] == "vulkan"


def test_adreno_phone_without_opencl_is_the_vulkan_only_phone(tmp_path):
    profile = probe(trees.vulkan_only_phone(tmp_path))
    assert [(d["type"], d["software"]) for d in profile["vulkan"]["devices"]] == [("integrated_gpu", False)]
    m = match(profile)
    assert m.name == "vulkan-only-phone" and m.backend_order == ("vulkan", "tflite", "cpu")
    assert profile["vulkan"]["litert_gpu_accelerator"]["usable"] is True  # 8 Gen 1 has asimddp


def test_adreno_phone_with_opencl_and_no_vulkan_driver_keeps_opencl(tmp_path):
    profile = probe(trees.adreno_phone(tmp_path))
    assert profile["vulkan"]["devices"] == [] and match(profile).name == "adreno-phone"


def test_container_without_sys_class_drm_and_a_software_device_never_picks_vulkan(tmp_path):
    profile = probe(trees.redroid_container(tmp_path))
    assert profile["vulkan"]["drm"]["present"] is False
    assert [(d["type"], d["software"]) for d in profile["vulkan"]["devices"]] == [("cpu", True)]  # SwiftShader
    assert "vulkan" not in match(profile).backend_order


@pytest.mark.parametrize(("record", "expected"), [
    ({"name": "llvmpipe (LLVM 15.0.6, 256 bits)", "type": "cpu", "driver": "llvmpipe"}, ("cpu", True)),
    ({"name": "SwiftShader Device (Subzero)", "type": "cpu", "driver": "SwiftShader driver"}, ("cpu", True)),
    ({"name": "Virtio-GPU Venus (Adreno (TM) 740)", "type": "virtual_gpu", "driver": "venus"},
     ("virtual_gpu", False)),
    ({"name": "Adreno (TM) 730", "type": "integrated_gpu", "driver": "Qualcomm Technologies Inc. Adreno Vulkan"},
     ("integrated_gpu", False)),
    ({"name": "Mali-G710", "type": "integrated_gpu", "driver": "Mali"}, ("integrated_gpu", False)),
])
def test_loader_records_are_classified(record, expected):
    (device,) = classify_loader_devices([record])
    assert (device["type"], device["software"]) == expected


def test_aarch64_without_dotprod_cannot_use_litert_gpu_accelerator():
    from device_profiles.probe import litert_gpu_accelerator

    assert litert_gpu_accelerator("aarch64", ["neon"])["usable"] is False
    assert litert_gpu_accelerator("aarch64", ["neon", "dotprod"])["usable"] is True


@pytest.mark.requires_vulkan
def test_this_machine_reports_its_vulkan_devices_from_the_loader():
    import shutil
    import subprocess

    from device_profiles.vulkan import parse_vulkaninfo_summary

    profile = probe("/")
    vk = profile["vulkan"]
    assert vk["source"] == "loader" and vk["devices"]
    if shutil.which("vulkaninfo"):  # independent oracle: the Khronos tool's own summary
        oracle = parse_vulkaninfo_summary(subprocess.run(["vulkaninfo", "--summary"], capture_output=True,
                                                         text=True, timeout=60).stdout)
        assert [(d["name"], d["type"], d["software"]) for d in vk["devices"]] == \
            [(d["name"], d["type"], d["software"]) for d in oracle]
    for device in vk["devices"]:
        assert device["api_version"].count(".") == 2 and device["driver"]
        if device["software"]:
            assert device["type"] == "cpu"  # lavapipe/llvmpipe: never a GPU
    if all(d["software"] for d in vk["devices"]):
        assert "vulkan" not in match(profile).backend_order
