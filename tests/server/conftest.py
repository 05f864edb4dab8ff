"""Fixtures for server tests: a model repository built from the model zoo, apps, a live server.

Repository (``repo``, session scope, read-only; copy it before changing it):

    mlp/1, mlp/2        two versions with different weights; config.toml serves both
    mobilenet/1         the demo-style CNN, default policy (latest)
    types/1             Identity for every KServe datatype (BOOL .. FP64, BYTES as strings)
    slow/1              an MLP with a 1-slot queue; ``slow_plans`` makes its plan slow
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from server_fixtures import LiveServer, build_types_model, slow_plans, write

@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge_runtime.model_zoo import build_mlp, build_mobilenet

    root = tmp_path_factory.mktemp("repository")
    write(root / "mlp" / "1" / "model.onnx", build_mlp(seed=0))
    write(root / "mlp" / "2" / "model.onnx", build_mlp(seed=5))
    (root / "mlp" / "config.toml").write_text('[serving]\nbackend = "cpu"\nversion_policy = "all"\n')
    write(root / "mobilenet" / "1" / "model.onnx", build_mobilenet())
    write(root / "types" / "1" / "model.onnx", build_types_model())
    for name in ("mobilenet", "types"):  # the server is under test, not backends: ONNX Runtime is the oracle
        (root / name / "config.toml").write_text('[serving]\nbackend = "cpu"\n')
    write(root / "slow" / "1" / "model.onnx", build_mlp(seed=3))
    (root / "slow" / "config.toml").write_text("[queue]\nmax_queue_size = 1\n[serving]\nbackend = \"cpu\"\n")
    return root


@pytest.fixture
def repo_copy(repo: Path, tmp_path: Path) -> Path:
    """A private copy of the repository for tests that change files."""
    return Path(shutil.copytree(repo, tmp_path / "repository"))


@pytest.fixture(scope="session")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    # Pinned cores: one cpu run slot with two threads, whatever the machine (tests count slots).
    rt = Runtime(RuntimeConfig(cache_dir=tmp_path_factory.mktemp("cache"), probe_opencl=False, intra_op_threads=2))
    yield rt
    rt.close()


AppFactory = Callable[..., Any]


@pytest.fixture
def make_app(runtime: Any, repo: Path) -> AppFactory:
    """``make_app(root=repo, extra_plans=slow_plans, load=None, cloud=None, **server_config)`` -> aiohttp app."""
    from edge_runtime.server.app import create_app
    from edge_runtime.server.config import ServerConfig
    from edge_runtime.serving.repository import ModelRepository

    def factory(root: Path | None = None, extra_plans: Callable[[Any], Any] = slow_plans, load: Any = None,
                cloud: Any = None, **config: Any) -> Any:
        repository = ModelRepository(root or repo, runtime, load=load, cloud=cloud, extra_plans=extra_plans,
                                     drain_timeout_s=5.0)
        return create_app(ServerConfig(**config), repository)

    return factory


@pytest.fixture
async def client(aiohttp_client: Any, make_app: AppFactory) -> Any:
    return await aiohttp_client(make_app())


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory, runtime: Any, repo: Path) -> Iterator[LiveServer]:
    from edge_runtime.server.app import create_app
    from edge_runtime.server.config import ServerConfig
    from edge_runtime.serving.repository import ModelRepository

    root = Path(shutil.copytree(repo, tmp_path_factory.mktemp("live") / "repository"))
    server = LiveServer(create_app(ServerConfig(port=0), ModelRepository(root, runtime))).start()
    yield server
    server.stop()


@pytest.fixture
def regions() -> Iterator[Any]:
    """Creates POSIX shm objects with unique keys (``tritonclient.utils.shared_memory``); destroys them after
    the test."""
    import uuid

    import tritonclient.utils.shared_memory as shm

    made = []

    def create(size: int) -> tuple[str, str, Any]:
        name = f"er-{uuid.uuid4().hex[:8]}"
        handle = shm.create_shared_memory_region(name, f"/{name}", size)
        made.append(handle)
        return name, f"/{name}", handle

    yield create
    for handle in made:
        shm.destroy_shared_memory_region(handle)
