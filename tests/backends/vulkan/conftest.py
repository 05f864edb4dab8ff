"""Vulkan test fixtures: one backend per session (one canary, one Mesa shader cache: see tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def vk_backend(tmp_path_factory: pytest.TempPathFactory):
    """The vulkan backend, asked for by name (so a software device such as lavapipe is used)."""
    from backends.vulkan import VulkanBackend

    backend = VulkanBackend(cache_dir=tmp_path_factory.mktemp("vk-cache"))
    availability = backend.availability()
    assert availability.ok, availability.reason
    return backend
