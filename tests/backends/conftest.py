"""Backend test fixtures: one backend per kind and session (one OpenCL context, one Vulkan canary)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ocl_backend():
    """A backend without disk caches or tuning: what most op tests need, fast."""
    from backends.opencl import OpenCLBackend

    return OpenCLBackend(cache_dir=None, tune=False)


@pytest.fixture(scope="session")
def vk_backend(tmp_path_factory: pytest.TempPathFactory):
    """The vulkan backend, asked for by name (so a software device such as lavapipe is used)."""
    from backends.vulkan import VulkanBackend

    backend = VulkanBackend(cache_dir=tmp_path_factory.mktemp("vk-cache"))
    availability = backend.availability()
    assert availability.ok, availability.reason
    return backend
