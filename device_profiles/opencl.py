"""OpenCL facts: ICD files, vendor libraries, and platforms/devices.

On the real root with pyopencl importable the platforms are enumerated;
otherwise (fake trees, Android without an ICD loader setup) devices are
inferred from vendor libraries on disk. The API is asked in a short-lived
subprocess (``print_enumeration``): an ICD loader and its
drivers (PoCL brings LLVM and libclang: tens of MiB) must not stay mapped in
a process that only probes, such as a daemon serving CPU models. A software device (PoCL on CPU
cores, llvmpipe, SwiftShader, clvk on lavapipe, rusticl on llvmpipe) is
reported with ``software=True`` and ``type="cpu"``, never as a GPU: it
shares the cores ONNX Runtime would use and is slower than it there.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from device_profiles import _fs
from device_profiles.gpu import family_of, is_software_name

log = logging.getLogger(__name__)

# Vendor OpenCL libraries as Android images ship them (no ICD loader there).
VENDOR_LIBRARIES = (
    "/vendor/lib64/libOpenCL.so", "/system/vendor/lib64/libOpenCL.so", "/vendor/lib64/libOpenCL-pixel.so",
    "/vendor/lib64/egl/libGLES_mali.so", "/system/lib64/libOpenCL.so", "/vendor/lib64/libPVROCL.so",
)
# Desktop Linux: libOpenCL.so is the ICD loader; devices come from /etc/OpenCL/vendors/*.icd.
LOADER_GLOBS = ("/usr/lib/*/libOpenCL.so*", "/usr/lib/libOpenCL.so*", "/usr/lib64/libOpenCL.so*")
_FAMILY_VENDOR = {"adreno": "Qualcomm", "mali": "ARM", "powervr": "Imagination Technologies",
                  "nvidia": "NVIDIA Corporation", "amd": "Advanced Micro Devices, Inc.", "intel": "Intel(R) Corporation"}


def classify(platform_name: str | None, vendor: str | None, name: str | None, cl_type: str) -> tuple[str, bool]:
    """``(type, software)`` of a device; ``cl_type`` is "gpu"/"cpu"/"accelerator"/"other" as the API said.

    PoCL devices are software unless PoCL drives real GPU hardware (pocl-cuda
    reports type GPU); a CPU-type device always runs on the host cores.
    """
    pocl = any("portable computing language" in (s or "").lower() or "pocl" in (s or "").lower()
               for s in (platform_name, vendor))
    software = is_software_name(name, vendor, platform_name) or cl_type == "cpu" or (pocl and cl_type != "gpu")
    return ("cpu" if software else cl_type), software


def _cl_type_name(cl: Any, bits: int) -> str:
    if bits & cl.device_type.GPU:
        return "gpu"
    if bits & cl.device_type.CPU:
        return "cpu"
    if bits & cl.device_type.ACCELERATOR:
        return "accelerator"
    return "other"


def _enumerate_pyopencl() -> tuple[list[dict], list[dict]] | None:
    """(platforms, devices) from pyopencl; None when pyopencl or an ICD loader is missing."""
    try:
        import pyopencl as cl
    except (ImportError, OSError) as exc:
        log.debug("pyopencl unavailable: %s", exc)
        return None
    try:
        cl_platforms = cl.get_platforms()
    except cl.Error as exc:  # e.g. PLATFORM_NOT_FOUND_KHR: no ICD at all
        log.debug("no OpenCL platform: %s", exc)
        return [], []
    platforms, devices = [], []
    for cl_platform in cl_platforms:
        try:
            platforms.append({"name": cl_platform.name, "vendor": cl_platform.vendor, "version": cl_platform.version})
            cl_devices = cl_platform.get_devices()
        except cl.Error as exc:
            log.debug("OpenCL platform %r: %s", getattr(cl_platform, "name", "?"), exc)
            continue
        for dev in cl_devices:
            try:
                kind, software = classify(cl_platform.name, dev.vendor, dev.name, _cl_type_name(cl, dev.type))
                devices.append({
                    "name": dev.name.strip(), "vendor": dev.vendor.strip(), "platform": cl_platform.name,
                    "type": kind, "software": software, "driver_version": dev.driver_version,
                    "version": dev.version, "compute_units": int(dev.max_compute_units),
                    "global_mem_bytes": int(dev.global_mem_size), "extensions": sorted(dev.extensions.split()),
                })
            except cl.Error as exc:
                log.debug("OpenCL device on %r: %s", cl_platform.name, exc)
    return platforms, devices


_CHILD = "from device_profiles.opencl import print_enumeration; print_enumeration()"
ENUMERATE_TIMEOUT_S = 30.0  # a driver that hangs while listing devices must not hang the probe


def _enumerate_in_subprocess() -> tuple[list[dict], list[dict]] | None:
    """``_enumerate_pyopencl`` in a child process (see the module docstring); None when it fails."""
    package_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                              timeout=ENUMERATE_TIMEOUT_S, env=env, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("OpenCL enumeration subprocess failed: %s", exc)
        return None
    if done.returncode != 0:
        log.warning("OpenCL enumeration subprocess exited %d: %s", done.returncode, done.stderr.strip()[-300:])
        return None
    try:
        document = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else None
    except json.JSONDecodeError as exc:
        log.warning("OpenCL enumeration subprocess printed no JSON: %s", exc)
        return None
    if document is None:
        return None
    return document["platforms"], document["devices"]


def _library_devices(root: str | os.PathLike, libraries: list[str], icd_files: list[str], gpu: dict) -> list[dict]:
    """Devices inferred without asking the API: a vendor library means the SoC's GPU."""
    devices = []
    if any(lib in VENDOR_LIBRARIES for lib in libraries):
        family = gpu.get("vendor") or family_of(*libraries)
        devices.append(_inferred(gpu.get("name") or (f"{family} GPU" if family else "vendor OpenCL GPU"),
                                 _FAMILY_VENDOR.get(family or "", "unknown"), "gpu", False))
    for icd in icd_files:
        library = (_fs.read_line(root, icd) or "").lower()
        text = f"{icd.lower()} {library}"
        if "pocl" in text:
            devices.append(_inferred("PoCL CPU device", "The pocl project", "cpu", True))
        elif family_of(text) and not is_software_name(text):
            family = family_of(text)
            devices.append(_inferred(f"{family} GPU", _FAMILY_VENDOR.get(family, "unknown"), "gpu", False))
    return devices


def _inferred(name: str, vendor: str, kind: str, software: bool) -> dict:
    return {"name": name, "vendor": vendor, "platform": None, "type": kind, "software": software,
            "driver_version": None, "version": None, "compute_units": None, "global_mem_bytes": None,
            "extensions": []}


def read_opencl(root: str | os.PathLike, gpu: dict, is_android: bool, *, use_api: bool = True) -> dict:
    """``{icd_files, libraries, platforms, devices, source, icd_hint}``.

    ``source`` is "pyopencl" when the API answered with devices, "libraries"
    when devices were inferred from files, "none" when nothing was found.
    ``icd_hint`` tells an Android user how to point an ICD loader (as
    pyopencl uses) at the vendor library.
    """
    icd_files = _fs.glob(root, "/etc/OpenCL/vendors/*.icd")
    vendor_libs = [p for p in VENDOR_LIBRARIES if _fs.is_file(root, p)]
    loaders = [p for pattern in LOADER_GLOBS for p in _fs.glob(root, pattern)]
    libraries = vendor_libs + loaders
    found = _enumerate_in_subprocess() if use_api and _fs.is_host(root) else None
    platforms, devices = found if found else ([], [])
    source = "pyopencl" if devices else "none"
    if not devices:
        devices = _library_devices(root, libraries, icd_files, gpu)
        source = "libraries" if devices else "none"
    icd_hint = None
    if is_android and not icd_files and vendor_libs:
        icd_hint = f"OCL_ICD_FILENAMES={vendor_libs[0]}"
    return {"icd_files": icd_files, "libraries": libraries, "platforms": platforms, "devices": devices,
            "source": source, "icd_hint": icd_hint}


def print_enumeration() -> None:
    """The child of ``_enumerate_in_subprocess``: one JSON line (null without pyopencl or a loader)."""
    found = _enumerate_pyopencl()
    print(json.dumps(None if found is None else {"platforms": found[0], "devices": found[1]}))
