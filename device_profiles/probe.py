"""The device probe: gathers every fact into one JSON-serialisable dict."""

from __future__ import annotations

import logging
import os
import platform

from device_profiles import _fs
from device_profiles.android import read_props, summarise
from device_profiles.cgroup import read_cgroup
from device_profiles.container import read_container
from device_profiles.cpu import read_cpu
from device_profiles.delegates import find_delegates
from device_profiles.gpu import detect_gpu, merge_api_devices
from device_profiles.load import find_load_sources
from device_profiles.memory import read_memory
from device_profiles.opencl import read_opencl
from device_profiles.vulkan import read_vulkan

log = logging.getLogger(__name__)

PROFILE_VERSION = 1


def litert_gpu_accelerator(arch: str | None, features: list[str]) -> dict:
    """Whether LiteRT's Linux GPU accelerator can run on this CPU: its aarch64 build needs dotprod (asimddp)."""
    if arch == "aarch64":
        usable = "dotprod" in features
        return {"usable": usable, "why": "asimddp (dotprod) present" if usable else
                "no asimddp (dotprod): LiteRT's aarch64 GPU accelerator would die with SIGILL"}
    return {"usable": arch == "x86_64", "why": f"built for x86_64 and aarch64; this CPU is {arch}"}


def probe(root: str | os.PathLike = "/", *, opencl: bool = True) -> dict:
    """Facts about the device whose filesystem is at ``root``.

    Every file is read under ``root``, so a fake tree (tests, a device image
    mounted on a workstation) answers exactly as the device would. Only when
    ``root`` is "/" does the probe also ask the host: ``getprop``, the
    affinity mask, ``platform.machine()``, ``vulkaninfo`` and — when
    ``opencl`` is True — pyopencl. Never raises for a missing or garbled
    file; such facts read as None / empty.

    Returns a dict with the keys ``os, arch, kernel, android, cpu, memory,
    cgroup, container, gpu, opencl, vulkan, tflite_delegates, load_sources``
    (plus ``root`` and ``profile_version``); ``json.dumps`` accepts it.
    """
    root = os.fspath(root)
    host = _fs.is_host(root)
    props, is_android = read_props(root)
    android = summarise(props) if is_android else None
    cgroup = read_cgroup(root)
    cpu, arch = read_cpu(root, cgroup)
    gpu = detect_gpu(root, android)
    cl = read_opencl(root, gpu, is_android, use_api=opencl)
    vk = read_vulkan(root)
    vk["litert_gpu_accelerator"] = litert_gpu_accelerator(arch, cpu.get("features") or [])
    kernel = _fs.read_line(root, "/proc/sys/kernel/osrelease") or (platform.release() if host else None)
    profile = {
        "profile_version": PROFILE_VERSION,
        "root": root,
        "os": "android" if is_android else "linux",
        "arch": arch,
        "kernel": kernel,
        "android": android,
        "cpu": cpu,
        "memory": read_memory(root, cgroup),
        "cgroup": cgroup,
        "container": read_container(root, props),
        "gpu": merge_api_devices(gpu, cl["devices"], vk["devices"]),
        "opencl": cl,
        "vulkan": vk,
        "tflite_delegates": find_delegates(root),
        "load_sources": find_load_sources(root),
    }
    log.debug("probed %s: %s %s, %s usable cores", root, profile["os"], arch, cpu["usable_cores"])
    return profile
