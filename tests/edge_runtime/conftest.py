"""Fixtures for runtime tests: model files written from the deterministic model zoo."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import onnx

    from edge_runtime.model_zoo import BUILDERS

    directory = tmp_path_factory.mktemp("models")
    for name, build in BUILDERS.items():
        onnx.save(build(), str(directory / f"{name}.onnx"))
    return directory


@pytest.fixture(scope="session")
def runtime(tmp_path_factory: pytest.TempPathFactory):
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    rt = Runtime(RuntimeConfig(cache_dir=tmp_path_factory.mktemp("cache")))
    yield rt
    rt.close()
