"""Fixtures for the cloud tests: a second edge-runtime process as the cloud, with a token.

Cloud repository (session scope):

    cnn/1              the whole test CNN
    faulty/1           fails inside ONNX Runtime on every run (the peer answers 503)
    det/1              a ``Det`` node (no OpenCL kernel: a model a GPU-only device cannot run)
    cnn_tail.k<i>/1    the tail of every candidate cut of the CNN
    cnn_tail/1         the tail of the first candidate cut
    cnn_tail.whole/1   the whole (prepared) CNN
    dag_tail/1         the DAG's tail after its Relu (two tensors cross: r and x)
    heavy_tail.k<i>/1  the tails of the first, a middle and the last candidate cut of the heavy model
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from cloud_fixtures import TOKEN, ServerProcess, build_cnn, build_dag, build_det, build_faulty, build_heavy, write_model


@pytest.fixture(scope="session")
def cloud_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge_runtime.cloud.manifest import write_cloud_repository
    from edge_runtime.cloud.split import ModelCutter

    root = tmp_path_factory.mktemp("cloud_repository")
    write_model(root, "cnn", build_cnn())
    write_model(root, "faulty", build_faulty())
    write_model(root, "det", build_det())
    cutter = ModelCutter(build_cnn())
    cuts = cutter.candidates()
    write_cloud_repository(cutter, cuts, cuts[0], root, "cnn_tail")
    heavy = ModelCutter(build_heavy())
    heavy_cuts = heavy.candidates()
    served = [heavy_cuts[0], heavy_cuts[len(heavy_cuts) // 2], heavy_cuts[-1]]  # a few: each tail is MBs
    write_cloud_repository(heavy, served, served[0], root, "heavy_tail")
    dag = ModelCutter(build_dag())
    write_model(root, "dag_tail", dag.extract(dag.resolve("r"))[1])
    return root


@pytest.fixture(scope="session")
def cloud_server(cloud_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log_path = tmp_path_factory.mktemp("cloud_logs") / "cloud.log"
    server = ServerProcess.start(cloud_repo, log_path, env={"EDGE_RUNTIME_TOKEN": TOKEN})
    yield server
    server.stop()


@pytest.fixture
def cloud_config(cloud_server: ServerProcess) -> Any:
    from edge_runtime.cloud.config import CloudConfig

    return CloudConfig(url=cloud_server.url, token=TOKEN, timeout_ms=5000, breaker_failures=3,
                       breaker_reset_ms=300, retry_backoff_ms=10)


@pytest.fixture(scope="session")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    rt = Runtime(RuntimeConfig(cache_dir=tmp_path_factory.mktemp("cache"), intra_op_threads=1, probe_opencl=False))
    yield rt
    rt.close()
