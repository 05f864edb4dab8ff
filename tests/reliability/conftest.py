"""Fixtures for the reliability suite: hostile input, overload, faults, security — over every route.

Repository (``rel_repo``, session scope, read-only; copy it before changing it):

    mlp/1        a small MLP (input [N, 64] -> output), cpu
    types/1      Identity for every KServe datatype (the server tests' model)
    gated/1      an MLP whose plan waits on a gate the test opens (``GATE``), 2-slot queue
    chat/1       the tiny decoder (``tiny_decoder``): /v1/* and /v2/models/chat/generate[_stream] answer
                 with a real model; a 96-token context keeps fuzzed requests short

Hypothesis profiles (``HYPOTHESIS_PROFILE``): ``ci`` (the default: derandomized,
bounded) and ``long`` (maintainers: many more examples, random seeds).

The helpers of the server and cloud suites are reused (``server_fixtures``,
``cloud_fixtures``); both folders are put on ``sys.path`` here so this folder
runs on its own.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hypothesis import HealthCheck, settings

HERE = Path(__file__).resolve().parent
for folder in (HERE.parent / "server", HERE.parent / "cloud"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from reliability_fixtures import GATE, TOKEN, gated_plans, generation_config, write_tiny_decoder  # noqa: E402
from server_fixtures import LiveServer, build_types_model, write  # noqa: E402

from edge_runtime.serving.repository import ModelRepository  # noqa: E402

settings.register_profile("ci", max_examples=120, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("long", max_examples=5000, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def tiny_decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny decoder's folder, built once (read-only: copy it into a repository). Its 4096 positions
    let a test cap the context with ``[generation] max_seq_len``."""
    return write_tiny_decoder(tmp_path_factory.mktemp("tiny_decoder") / "tiny", max_positions=4096)


@pytest.fixture(scope="session")
def rel_repo(tmp_path_factory: pytest.TempPathFactory, tiny_decoder: Path) -> Path:
    from edge_runtime.model_zoo import build_mlp

    root = tmp_path_factory.mktemp("rel_repository")
    shutil.copytree(tiny_decoder, root / "chat" / "1")
    (root / "chat" / "config.toml").write_text(generation_config(max_batch_size=2, max_queue=4, max_seq_len=96))
    write(root / "mlp" / "1" / "model.onnx", build_mlp(seed=0))
    write(root / "types" / "1" / "model.onnx", build_types_model())
    write(root / "gated" / "1" / "model.onnx", build_mlp(seed=3))
    for name in ("mlp", "types"):
        (root / name / "config.toml").write_text('[serving]\nbackend = "cpu"\n')
    (root / "gated" / "config.toml").write_text('[queue]\nmax_queue_size = 2\n[serving]\nbackend = "cpu"\n')
    return root


@pytest.fixture
def rel_repo_copy(rel_repo: Path, tmp_path: Path) -> Path:
    """A private copy of the repository for tests that change files."""
    return Path(shutil.copytree(rel_repo, tmp_path / "repository"))


@pytest.fixture(scope="session")
def rel_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    rt = Runtime(RuntimeConfig(cache_dir=tmp_path_factory.mktemp("rel_cache"), intra_op_threads=1,
                               probe_opencl=False))
    yield rt
    rt.close()


@pytest.fixture
def make_rel_app(rel_runtime: Any, rel_repo: Path) -> Callable[..., Any]:
    """``make_rel_app(root=rel_repo, extra_plans=gated_plans, cloud=None, **server_config)`` -> aiohttp app."""
    from edge_runtime.server.app import create_app
    from edge_runtime.server.config import ServerConfig


    def factory(root: Path | None = None, extra_plans: Callable[[Any], Any] = gated_plans, cloud: Any = None,
                runtime: Any = None, **config: Any) -> Any:
        repository = ModelRepository(root or rel_repo, runtime or rel_runtime, cloud=cloud, extra_plans=extra_plans,
                                     drain_timeout_s=5.0)
        return create_app(ServerConfig(**config), repository)

    return factory


@pytest.fixture
def gate() -> Iterator[Any]:
    """The gate of the ``gated`` model, closed; opened again after the test so nothing stays blocked."""
    GATE.clear()
    yield GATE
    GATE.set()


@pytest.fixture(scope="module")
def rel_live(tmp_path_factory: pytest.TempPathFactory, rel_runtime: Any, rel_repo: Path) -> Iterator[LiveServer]:
    """The real app on loopback in a thread, with a token (Schemathesis and other synchronous clients)."""
    from edge_runtime.server.app import create_app
    from edge_runtime.server.config import ServerConfig

    GATE.set()  # the fuzzers may call the gated model: let it run
    root = Path(shutil.copytree(rel_repo, tmp_path_factory.mktemp("rel_live") / "repository"))
    server = LiveServer(create_app(ServerConfig(port=0, token=TOKEN, max_body_bytes=1 << 20),
                                   ModelRepository(root, rel_runtime, extra_plans=gated_plans))).start()
    yield server
    server.stop()
