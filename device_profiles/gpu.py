"""Which GPU the device has, from kernel nodes, Android properties and vendor libraries.

GPU families: ``adreno``, ``mali``, ``powervr``, ``nvidia``, ``amd``, ``intel``,
and ``virtio`` for a virtual GPU (virtio-gpu with virgl/venus, gfxstream) as
cloud phones expose it. Software renderers (SwiftShader, llvmpipe, lavapipe)
are never a GPU here.
"""

from __future__ import annotations

import os

from device_profiles import _fs

# Substrings of a device/vendor/driver name -> GPU family; checked in order.
_FAMILY_WORDS = (
    ("adreno", "adreno"), ("qualcomm", "adreno"), ("mali", "mali"), ("powervr", "powervr"),
    ("imagination", "powervr"), ("nvidia", "nvidia"), ("geforce", "nvidia"), ("radeon", "amd"),
    ("advanced micro devices", "amd"), ("intel", "intel"), ("virtio", "virtio"), ("venus", "virtio"),
    ("gfxstream", "virtio"), ("virgl", "virtio"),
)
SOFTWARE_WORDS = ("llvmpipe", "lavapipe", "swiftshader", "softpipe", "pastel")
# ro.hardware.egl / ro.hardware.vulkan values of virtual GPUs (gfxstream "emulation"/"ranchu").
_VIRTUAL_PROPS = ("emulation", "ranchu", "gfxstream", "virgl", "venus")


def family_of(*names: str | None) -> str | None:
    """The GPU family named in any of ``names`` (case-insensitive), or None."""
    text = " ".join(n for n in names if n).lower()
    return next((family for word, family in _FAMILY_WORDS if word in text), None)


def is_software_name(*names: str | None) -> bool:
    """Whether a name is a CPU-side software renderer."""
    text = " ".join(n for n in names if n).lower()
    return any(word in text for word in SOFTWARE_WORDS)


def _kernel_evidence(root: str | os.PathLike) -> list[tuple[str, str, str | None]]:
    """(family, evidence path, model name or None) from kernel nodes and vendor libraries."""
    found: list[tuple[str, str, str | None]] = []
    if _fs.exists(root, "/sys/class/kgsl/kgsl-3d0"):
        found.append(("adreno", "/sys/class/kgsl/kgsl-3d0", _fs.read_line(root, "/sys/class/kgsl/kgsl-3d0/gpu_model")))
    mali_paths = ["/sys/class/misc/mali0", "/dev/mali0", *_fs.glob(root, "/sys/devices/platform/*.mali"),
                  "/vendor/lib64/egl/libGLES_mali.so"]
    found += [("mali", p, None) for p in mali_paths if _fs.exists(root, p)][:1]
    found += [("powervr", p, None) for p in ("/dev/pvrsrvkm", "/vendor/lib64/libPVROCL.so")
              if _fs.exists(root, p)][:1]
    for uevent in _fs.glob(root, "/sys/class/drm/card*/device/uevent"):
        driver = _fs.parse_props(_fs.read_text(root, uevent)).get("DRIVER", "")
        if driver == "virtio_gpu":
            found.append(("virtio", uevent, "virtio-gpu"))
            break
    return found


def detect_gpu(root: str | os.PathLike, android: dict | None) -> dict:
    """``{vendor, virtual, software_only, name, evidence}`` before any API is asked.

    ``vendor`` is a family name or None; ``software_only`` is True when the
    only renderer in evidence is a software one (e.g. redroid with
    SwiftShader); ``evidence`` lists what was seen, for explanations.
    """
    evidence: list[str] = []
    vendor = name = None
    for family, path, model in _kernel_evidence(root):
        evidence.append(f"{family}: {path}")
        if vendor is None:
            vendor, name = family, model
    props = android or {}
    software_seen = False
    for key in ("egl", "vulkan"):
        value = (props.get(key) or "").lower()
        if not value:
            continue
        if is_software_name(value):
            software_seen = True
            evidence.append(f"software renderer: ro.hardware.{key}={value}")
        elif value in _VIRTUAL_PROPS or family_of(value):
            family = "virtio" if value in _VIRTUAL_PROPS else family_of(value)
            evidence.append(f"{family}: ro.hardware.{key}={value}")
            vendor = vendor or family
    return {"vendor": vendor, "virtual": vendor == "virtio", "software_only": vendor is None and software_seen,
            "name": name, "evidence": evidence}


def merge_api_devices(gpu: dict, opencl_devices: list[dict], vulkan_devices: list[dict]) -> dict:
    """``gpu`` completed with hardware devices the OpenCL/Vulkan enumeration found."""
    merged = dict(gpu, evidence=list(gpu["evidence"]))
    for api, devices in (("opencl", opencl_devices), ("vulkan", vulkan_devices)):
        for device in devices:
            if device.get("software"):
                continue
            family = family_of(device.get("name"), device.get("vendor"))
            if family is None:
                continue
            merged["evidence"].append(f"{family}: {api} device {device.get('name')!r}")
            if merged["vendor"] is None:
                merged.update(vendor=family, virtual=family == "virtio", software_only=False,
                              name=device.get("name"))
    return merged
