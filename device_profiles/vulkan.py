"""Vulkan facts: loader, ICD manifests / Android HAL drivers, devices, and ``/sys/class/drm``.

On the real root devices come from the loader itself, asked in a child process
(``vulkan_loader``), else from ``vulkaninfo --summary``. A software device
(``VK_PHYSICAL_DEVICE_TYPE_CPU``, or lavapipe/llvmpipe/SwiftShader by name) is
``software: true`` and never counts as a GPU.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess

from device_profiles import _fs
from device_profiles.gpu import is_software_name
from device_profiles.vulkan_loader import query_devices

log = logging.getLogger(__name__)

VULKANINFO_TIMEOUT_S = 10.0
LOADER_PATHS = ("/system/lib64/libvulkan.so", "/vendor/lib64/libvulkan.so")
LOADER_GLOBS = ("/usr/lib/*/libvulkan.so*", "/usr/lib/libvulkan.so*", "/usr/lib64/libvulkan.so*")
ICD_GLOBS = ("/usr/share/vulkan/icd.d/*.json", "/etc/vulkan/icd.d/*.json", "/usr/local/share/vulkan/icd.d/*.json")
ANDROID_DRIVER_GLOBS = ("/vendor/lib64/hw/vulkan.*.so", "/system/lib64/hw/vulkan.*.so")
# Android HAL driver suffix (vulkan.<name>.so) -> (device type, software).
_ANDROID_DRIVERS = {
    "pastel": ("cpu", True), "lvp": ("cpu", True), "swiftshader": ("cpu", True),
    "ranchu": ("virtual_gpu", False), "virtio": ("virtual_gpu", False),
}
_TYPES = {"PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU": "integrated_gpu", "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU": "discrete_gpu",
          "PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU": "virtual_gpu", "PHYSICAL_DEVICE_TYPE_CPU": "cpu"}
_SUMMARY_FIELD = re.compile(r"^\s*(\w+)\s*=\s*(.*?)\s*$")


def parse_vulkaninfo_summary(text: str | None) -> list[dict]:
    """Devices from ``vulkaninfo --summary`` output: ``[{name, type, software, driver}]``."""
    devices: list[dict] = []
    current: dict | None = None
    for line in (text or "").splitlines():
        if re.match(r"^GPU\d+:\s*$", line.strip()):
            current = {}
            devices.append(current)
            continue
        field = _SUMMARY_FIELD.match(line)
        if current is not None and field:
            current[field.group(1)] = field.group(2)
    parsed = []
    for fields in devices:
        name = fields.get("deviceName")
        if not name:
            continue
        kind = _TYPES.get(fields.get("deviceType", ""), "other")
        software = kind == "cpu" or is_software_name(name, fields.get("driverName"))
        parsed.append({"name": name, "type": "cpu" if software else kind, "software": software,
                       "driver": fields.get("driverName")})
    return parsed


def _run_vulkaninfo() -> list[dict] | None:
    binary = shutil.which("vulkaninfo")
    if binary is None:
        return None
    try:
        done = subprocess.run([binary, "--summary"], capture_output=True, text=True,
                              timeout=VULKANINFO_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("vulkaninfo failed: %s", exc)
        return None
    return parse_vulkaninfo_summary(done.stdout)


def classify_loader_devices(devices: list[dict]) -> list[dict]:
    """Loader records (see vulkan_loader) with ``software`` set and software devices typed ``cpu``."""
    classified = []
    for device in devices:
        software = device.get("type") == "cpu" or is_software_name(device.get("name"), device.get("driver"))
        classified.append({**device, "type": "cpu" if software else device.get("type", "other"),
                           "software": software})
    return classified


def read_drm(root: str | os.PathLike) -> dict:
    """``{present, cards, drivers}`` of ``/sys/class/drm``: where ONNX Runtime looks for GPUs on Linux."""
    cards = sorted(os.path.basename(p) for p in _fs.glob(root, "/sys/class/drm/card*") if "-" not in os.path.basename(p))
    drivers = sorted({_fs.parse_props(_fs.read_text(root, f"/sys/class/drm/{c}/device/uevent")).get("DRIVER", "")
                      for c in cards} - {""})
    return {"present": _fs.exists(root, "/sys/class/drm"), "cards": cards, "drivers": drivers}


def _android_driver_devices(drivers: list[str]) -> list[dict]:
    devices = []
    for path in drivers:
        suffix = os.path.basename(path)[len("vulkan."):-len(".so")]
        kind, software = _ANDROID_DRIVERS.get(suffix, ("integrated_gpu", False))
        devices.append({"name": f"vulkan.{suffix}", "type": kind, "software": software, "driver": path})
    return devices


def read_vulkan(root: str | os.PathLike) -> dict:
    """``{loader, icd_files, drivers, devices, source, drm}``.

    On the real root devices come from the loader in a child process
    ("loader"), else ``vulkaninfo --summary`` ("vulkaninfo"); otherwise from Android HAL driver files
    ``vulkan.<name>.so`` ("drivers"); "none" when neither says anything.
    """
    loaders = [p for p in LOADER_PATHS if _fs.is_file(root, p)]
    loaders += [p for pattern in LOADER_GLOBS for p in _fs.glob(root, pattern)]
    icd_files = [p for pattern in ICD_GLOBS for p in _fs.glob(root, pattern)]
    drivers = [p for pattern in ANDROID_DRIVER_GLOBS for p in _fs.glob(root, pattern)]
    devices, source = None, "none"
    if _fs.is_host(root) and loaders:
        found, note = query_devices()
        if found is not None:
            devices, source = classify_loader_devices(found), "loader"
        else:
            log.info("vulkan: %s; trying vulkaninfo", note)
            devices = _run_vulkaninfo()
            source = "vulkaninfo" if devices else "none"
    if not devices and drivers:
        devices, source = _android_driver_devices(drivers), "drivers"
    return {"loader": loaders[0] if loaders else None, "icd_files": icd_files, "drivers": drivers,
            "devices": devices or [], "source": source, "drm": read_drm(root)}
