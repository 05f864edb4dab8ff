"""One shared OpenCL context per device, and the device facts the backend needs.

Contexts are costly to create (PoCL starts its compiler state per context),
so every backend instance, executable and the ONNX backend API share the one
held here. pyopencl is imported lazily.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.errors import BackendUnavailableError

if TYPE_CHECKING:
    import pyopencl as cl

log = logging.getLogger(__name__)

_lock = threading.Lock()
_handles: dict[str, "DeviceHandle"] = {}


@dataclass(frozen=True)
class DeviceInfo:
    """What the compiler and the caches need to know about a device."""

    name: str
    platform: str
    driver_version: str
    device_version: str
    kind: str  # "gpu" | "cpu" | "accelerator"
    compute_units: int
    max_work_group_size: int
    local_mem_bytes: int
    has_fp16: bool
    # IEEE-rounded fp32 division and sqrt on request (``-cl-fp32-correctly-rounded-divide-sqrt``)
    correct_divide: bool = False
    host_unified: bool = True  # the device reads the host's memory (phones, PoCL); false: a discrete GPU

    @property
    def cache_identity(self) -> str:
        """The part of every cache key that pins the device and its driver."""
        return f"{self.platform}|{self.name}|{self.driver_version}|{self.device_version}"


class DeviceHandle:
    """A device with its shared context; queues are made per executable."""

    def __init__(self, device: "cl.Device", info: DeviceInfo) -> None:
        import pyopencl as cl

        self.device = device
        self.info = info
        self.context = cl.Context([device])

    def new_queue(self, profiling: bool = False) -> "cl.CommandQueue":
        """An in-order queue on this device; ``profiling`` enables event timestamps."""
        import pyopencl as cl

        props = cl.command_queue_properties.PROFILING_ENABLE if profiling else 0
        return cl.CommandQueue(self.context, self.device, properties=props)


def _kind(device: "cl.Device") -> str:
    import pyopencl as cl

    if device.type & cl.device_type.GPU:
        return "gpu"
    if device.type & cl.device_type.ACCELERATOR:
        return "accelerator"
    return "cpu"


def _info(device: "cl.Device") -> DeviceInfo:
    import pyopencl as cl

    extensions = set(device.extensions.split())
    return DeviceInfo(
        name=device.name.strip(),
        platform=device.platform.name.strip(),
        driver_version=device.driver_version.strip(),
        device_version=device.version.strip(),
        kind=_kind(device),
        compute_units=int(device.max_compute_units),
        max_work_group_size=int(device.max_work_group_size),
        local_mem_bytes=int(device.local_mem_size),
        has_fp16="cl_khr_fp16" in extensions,
        correct_divide=bool(int(device.single_fp_config) & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT),
        host_unified=_host_unified(device),
    )


def _host_unified(device: "cl.Device") -> bool:
    """CL_DEVICE_HOST_UNIFIED_MEMORY (deprecated by OpenCL 2.0, still answered by the drivers seen: NVIDIA
    false, PoCL true); a driver that refuses the query is taken as unified, the common case on phones."""
    import pyopencl as cl

    try:
        return bool(device.host_unified_memory)
    except (cl.Error, AttributeError):
        return True


def _pick_device() -> "cl.Device":
    """A GPU if there is one, then an accelerator, then a CPU device (PoCL)."""
    import pyopencl as cl

    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:
        raise BackendUnavailableError(f"opencl: no OpenCL platform ({exc})") from exc
    devices = [d for p in platforms for d in p.get_devices()]
    if not devices:
        raise BackendUnavailableError("opencl: OpenCL platforms found but no device")
    order = {"gpu": 0, "accelerator": 1, "cpu": 2}
    return sorted(devices, key=lambda d: order[_kind(d)])[0]


def probe_device() -> DeviceInfo:
    """Facts of the device :func:`shared_device` would use; no context is created.

    Raises BackendUnavailableError when pyopencl or an OpenCL device is missing.
    """
    try:
        import pyopencl  # noqa: F401  (import check only)
    except ImportError as exc:
        raise BackendUnavailableError(f"opencl: pyopencl is not importable ({exc})") from exc
    return _info(_pick_device())


def shared_device() -> DeviceHandle:
    """The process-wide handle (device + context) of the preferred device."""
    import pyopencl as cl

    info = probe_device()
    with _lock:
        handle = _handles.get(info.cache_identity)
        if handle is None:
            try:
                handle = DeviceHandle(_pick_device(), info)
            except cl.Error as exc:
                raise BackendUnavailableError(
                    f"opencl: cannot create a context on {info.name!r}: {exc}") from exc
            _handles[info.cache_identity] = handle
            log.info("opencl: using %s (%s, driver %s)", info.name, info.platform, info.driver_version)
        return handle


def describe_info(info: DeviceInfo) -> dict[str, Any]:
    """The device facts as plain data for ``describe()``."""
    return {"name": info.name, "platform": info.platform, "driver": info.driver_version,
            "kind": info.kind, "compute_units": info.compute_units, "fp16": info.has_fp16}
