"""Vulkan physical devices through the loader (``libvulkan``), asked in a short-lived child process.

A broken Vulkan driver can crash or hang inside ``vkCreateInstance``; asking
in a child with a timeout keeps the probe (and the daemon) alive. The child is
``python -m device_profiles.vulkan_loader``: it prints one JSON line, a list of
``{name, type, vendor_id, device_id, api_version, driver_version, driver,
driver_info}``.

Written with ctypes because no maintained pure-Python Vulkan binding ships
wheels for Android/aarch64, and only four loader entry points are needed.
Struct layouts follow the Vulkan 1.1 headers; only each struct's head is read.
"""

from __future__ import annotations

import ctypes
import json
import logging
import subprocess
import sys

log = logging.getLogger(__name__)

LOADER_NAMES = ("libvulkan.so.1", "libvulkan.so")
CHILD_TIMEOUT_S = 20.0
_DEVICE_TYPES = {0: "other", 1: "integrated_gpu", 2: "discrete_gpu", 3: "virtual_gpu", 4: "cpu"}
_VK_API_1_1 = (1 << 22) | (1 << 12)
_STYPE_APPLICATION_INFO = 0
_STYPE_INSTANCE_CREATE_INFO = 1
_STYPE_PROPERTIES_2 = 1000059001
_STYPE_DRIVER_PROPERTIES = 1000196000
_NAME_SIZE = 256
_PROPS_BYTES = 4096  # VkPhysicalDeviceProperties is ~824 bytes; the rest is headroom


class _AppInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", ctypes.c_uint32), ("pEngineName", ctypes.c_char_p),
                ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]


class _InstanceInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.POINTER(_AppInfo)), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


class _DriverProps(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("driverID", ctypes.c_int),
                ("driverName", ctypes.c_char * _NAME_SIZE), ("driverInfo", ctypes.c_char * _NAME_SIZE),
                ("conformanceVersion", ctypes.c_uint8 * 4)]


class _Props2(ctypes.Structure):
    # properties: apiVersion, driverVersion, vendorID, deviceID, deviceType, deviceName, ... (rest unread)
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("apiVersion", ctypes.c_uint32),
                ("driverVersion", ctypes.c_uint32), ("vendorID", ctypes.c_uint32), ("deviceID", ctypes.c_uint32),
                ("deviceType", ctypes.c_int), ("deviceName", ctypes.c_char * _NAME_SIZE),
                ("_rest", ctypes.c_uint8 * _PROPS_BYTES)]


def version_text(packed: int) -> str:
    """``VK_MAKE_API_VERSION`` unpacked: ``"1.4.305"``."""
    return f"{(packed >> 22) & 0x7F}.{(packed >> 12) & 0x3FF}.{packed & 0xFFF}"


def enumerate_devices() -> list[dict]:
    """Every physical device the loader offers (in this process; see :func:`query_devices`)."""
    vk = _open_loader()
    app = _AppInfo(_STYPE_APPLICATION_INFO, None, b"edge-runtime-probe", 1, b"edge-runtime", 1, _VK_API_1_1)
    info = _InstanceInfo(_STYPE_INSTANCE_CREATE_INFO, None, 0, ctypes.pointer(app), 0, None, 0, None)
    instance = ctypes.c_void_p()
    result = vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance))
    if result != 0:
        raise OSError(f"vkCreateInstance returned {result}")
    try:
        count = ctypes.c_uint32(0)
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        handles = (ctypes.c_void_p * count.value)()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        return [_describe(vk, handle) for handle in handles[:count.value]]
    finally:
        vk.vkDestroyInstance(instance, None)


def _open_loader() -> ctypes.CDLL:
    errors = []
    for name in LOADER_NAMES:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    raise OSError(f"no Vulkan loader: {'; '.join(errors)}")


def _describe(vk: ctypes.CDLL, handle: int) -> dict:
    driver = _DriverProps(_STYPE_DRIVER_PROPERTIES, None)
    props = _Props2(_STYPE_PROPERTIES_2, ctypes.cast(ctypes.pointer(driver), ctypes.c_void_p))
    vk.vkGetPhysicalDeviceProperties2(ctypes.c_void_p(handle), ctypes.byref(props))
    return {"name": props.deviceName.decode(errors="replace"), "type": _DEVICE_TYPES.get(props.deviceType, "other"),
            "vendor_id": f"0x{props.vendorID:04x}", "device_id": f"0x{props.deviceID:04x}",
            "api_version": version_text(props.apiVersion), "driver_version": props.driverVersion,
            "driver": driver.driverName.decode(errors="replace") or None,
            "driver_info": driver.driverInfo.decode(errors="replace") or None}


def query_devices(timeout_s: float = CHILD_TIMEOUT_S, env: dict | None = None) -> tuple[list[dict] | None, str]:
    """``(devices, note)`` from a child process; devices None when the child failed (the note says how)."""
    command = [sys.executable, "-m", "device_profiles.vulkan_loader"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False, env=env)
    except subprocess.TimeoutExpired:
        return None, f"the Vulkan loader did not answer within {timeout_s:g} s (driver hang)"
    except OSError as exc:
        return None, f"the Vulkan probe child could not start: {exc}"
    if done.returncode != 0:
        tail = (done.stderr or "").strip().splitlines()[-1:] or [""]
        return None, f"the Vulkan probe child exited with {done.returncode}: {tail[0][:200]}"
    try:
        devices = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        return None, f"the Vulkan probe child printed no device list: {exc}"
    return devices, "vulkan loader"


def main() -> int:
    print(json.dumps(enumerate_devices()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
