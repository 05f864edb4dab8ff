"""Fixtures for scheduler tests: zoo models, real executables, a load monitor on an empty tree."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def mlp_proto():
    from edge_runtime.model_zoo import build_mlp

    return build_mlp()


@pytest.fixture(scope="session")
def mlp_cpu(mlp_proto):
    """The mlp on the ``cpu`` backend (ONNX Runtime, one intra-op thread)."""
    from scheduler_fakes import compile_on

    return compile_on("cpu", mlp_proto)


@pytest.fixture(scope="session")
def mlp_gpu_standin(mlp_proto):
    """A second, independent ONNX Runtime session of the mlp: the "gpu" plan's stand-in."""
    from scheduler_fakes import compile_on

    return compile_on("cpu", mlp_proto)


@pytest.fixture
def monitor(tmp_path: Path):
    """A LoadMonitor over an empty fake tree (no counters): tests pin what they need."""
    from edge_runtime.load_monitor import LoadMonitor

    return LoadMonitor(root=tmp_path, gpu_source={})
