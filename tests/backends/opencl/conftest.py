"""OpenCL test fixtures: one backend (and so one shared context) per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ocl_backend():
    """A backend without disk caches or tuning: what most op tests need, fast."""
    from backends.opencl import OpenCLBackend

    return OpenCLBackend(cache_dir=None, tune=False)
