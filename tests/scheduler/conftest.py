"""Fixtures for scheduler tests: zoo models, real executables, a runtime, a load monitor on an empty tree."""

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


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory):
    """A ``Runtime`` with two intra-op threads and no OpenCL probe, its cache in a temp dir."""
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    rt = Runtime(RuntimeConfig(cache_dir=tmp_path_factory.mktemp("cache"), intra_op_threads=2, probe_opencl=False))
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory):
    """A small MobileNet-style CNN (32x32 input) saved to a file: (path, proto)."""
    import onnx

    from edge_runtime.model_zoo import build_mobilenet

    proto = build_mobilenet(image_size=32)
    path = tmp_path_factory.mktemp("models") / "cnn.onnx"
    onnx.save(proto, str(path))
    return path, proto
