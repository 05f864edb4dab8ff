"""Fixtures for the ncnn backend tests: models written to disk, a private cache, a runtime racing ncnn."""

from __future__ import annotations

from pathlib import Path

import pytest

THREADS = 2  # pinned: the same on 2 cores and on 64


@pytest.fixture
def ncnn_cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def options(ncnn_cache: Path):
    from backends.base import CompileOptions

    return CompileOptions(intra_op_threads=THREADS, cache_dir=ncnn_cache)


@pytest.fixture
def make_runtime(ncnn_cache: Path):
    """Runtimes whose backend order races ncnn against cpu, sharing the test's cache."""
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    made = []

    def make(order: tuple[str, ...] = ("ncnn", "cpu")):
        rt = Runtime(RuntimeConfig(cache_dir=ncnn_cache, intra_op_threads=THREADS, backend_order=order))
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.close()
