"""The one place that names concrete backends: lazy import strings, in no order.

Importing a backend module may import its native library (pyopencl, LiteRT),
so a backend is imported only when the runtime first asks about it.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

from backends.base import Availability, Backend
from backends.descriptors import DESCRIPTORS

log = logging.getLogger(__name__)

BACKENDS: dict[str, str] = {
    "cpu": "backends.cpu:CPUBackend",
    "opencl": "backends.opencl:OpenCLBackend",
    "tflite": "backends.tflite:TFLiteBackend",
    "vulkan": "backends.vulkan:VulkanBackend",
    "ncnn": "backends.ncnn:NcnnBackend",
    "ncnn_vulkan": "backends.ncnn:NcnnVulkanBackend",
    "null": "backends.null:NullBackend",
}

# Backends a user can name on the command line: described as selectable and importable by name.
USER_BACKENDS = tuple(name for name, d in DESCRIPTORS.items() if d.selectable and name in BACKENDS)


def construct(name: str, cache_dir: Path | None) -> tuple[Backend | None, Availability]:
    """Import and build backend ``name``; an import failure is an unavailability, not a crash."""
    target = BACKENDS.get(name)
    if target is None:
        return None, Availability.no(f"unknown backend {name!r}; known: {sorted(BACKENDS)}")
    module_name, class_name = target.split(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        return None, Availability.no(f"{target} cannot be imported: {exc}")
    backend = cls(cache_dir=cache_dir)
    try:
        availability = backend.availability()
    except Exception as exc:  # a broken driver must not take the runtime down
        log.warning("backend %s: availability check failed: %s", name, exc)
        availability = Availability.no(f"availability check failed: {exc}")
    return backend, availability
