"""A Triton-style model repository and the versions of it being served.

Layout::

    <root>/<model>/config.toml          optional: [scheduler] [batching] [queue] [cloud] [serving]
    <root>/<model>/<version>/model.onnx (or model.tflite); version = a positive integer

``[serving]``: see ``layout.py``.

A (re)load compiles every chosen version first and swaps them in only when all
succeeded, so a failed reload leaves the old versions serving. Versions taken
out of service drain their queues before their models close.

Each version answers through a ``Dispatcher`` (``dispatch.py``): the scheduler
``scheduler_for`` builds for its ``[scheduler]`` policy, fed by the server's one
LoadMonitor, and a cloud router where its ``[cloud]`` section asks for one. A
version that cannot load here (its backend is unavailable, or cannot take
every node) is served by the cloud alone when its ``[cloud]`` mode allows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from edge_runtime.config import from_mapping
from edge_runtime.errors import (
    BackendUnavailableError,
    ConfigError,
    EdgeRuntimeError,
    ModelLoadError,
    ModelNotFoundError,
    UnsupportedNodesError,
)
from edge_runtime.generation.folder import is_generative_folder
from edge_runtime.scheduler import ModelConfig, ModelScheduler
from edge_runtime.scheduler.config import load_model_config
from edge_runtime.scheduler.factory import serving_options
from edge_runtime.serving.dispatch import Dispatcher, RemoteModel, build_dispatcher, remote_model
from edge_runtime.serving.layout import MODEL_NAME, ServingConfig, check_model_name, model_file

if TYPE_CHECKING:
    from edge_runtime.cloud.config import CloudConfig
    from edge_runtime.load_monitor import LoadConfig
    from edge_runtime.model import Model
    from edge_runtime.runtime import Runtime
    from edge_runtime.scheduler.plans import Plan
    from edge_runtime.serving.services import SharedServices

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class LoadedVersion:
    """One served version: its model (a ``RemoteModel`` when only the cloud runs it), how it
    answers, the config it was loaded with."""

    name: str
    version: int
    model: "Model | RemoteModel"
    dispatcher: Dispatcher
    config: ModelConfig
    serving: ServingConfig
    memory_bytes: int = 0  # resident bytes its load added (at least the model file's size)

    @property
    def scheduler(self) -> ModelScheduler | None:
        return self.dispatcher.scheduler


PlansFor = Callable[["Model"], Mapping[str, "Plan"]]
CANNOT_LOAD_HERE = (BackendUnavailableError, UnsupportedNodesError)  # the cloud may still answer


class ModelRepository:
    """Loads, serves and unloads the models of one repository directory (event-loop side).

    ``load`` and ``cloud`` are the server's ``[load]`` and ``[cloud]`` tables; the
    LoadMonitor and CloudClient they describe are opened by ``start`` (or the
    first load) and closed by ``close``. ``extra_plans`` (tests, tools) returns
    plans added to, or replacing, those the scheduler factory offers a model.
    """

    def __init__(self, root: Path, runtime: "Runtime", *, load: "LoadConfig | None" = None,
                 cloud: "CloudConfig | None" = None, extra_plans: PlansFor | None = None,
                 drain_timeout_s: float = 10.0) -> None:
        self.root = Path(root)
        self.runtime = runtime
        self._load_config = load
        self._cloud_config = cloud
        self.services: SharedServices | None = None
        self._extra_plans = extra_plans
        self._drain_timeout_s = drain_timeout_s
        self._served: dict[str, dict[int, LoadedVersion]] = {}
        self._failures: dict[str, str] = {}  # model -> why its last load failed
        self._lock = asyncio.Lock()  # one load/unload at a time: compiles compete for the same cores
        self._retiring: set[asyncio.Task] = set()

    # -- what is on disk ---------------------------------------------------------------
    def names_on_disk(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and MODEL_NAME.fullmatch(p.name) and self.versions_on_disk(p.name))

    def versions_on_disk(self, name: str) -> list[int]:
        directory = self.root / name
        if not directory.is_dir():
            return []
        return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0)

    # -- serving -----------------------------------------------------------------------
    def get(self, name: str, version: int | None = None) -> LoadedVersion:
        """The served version (highest when ``version`` is None); ModelNotFoundError names what is served."""
        versions = self._served.get(name)
        if not versions:
            raise ModelNotFoundError(f"unknown model {name!r}; served models: {sorted(self._served)}")
        if version is None:
            return versions[max(versions)]
        if version not in versions:
            raise ModelNotFoundError(f"model {name!r} has no version {version} loaded; "
                                     f"loaded versions: {sorted(versions)}")
        return versions[version]

    def served(self) -> list[LoadedVersion]:
        return [v for name in sorted(self._served) for _, v in sorted(self._served[name].items())]

    def versions_served(self, name: str) -> list[int]:
        return sorted(self._served.get(name, {}))

    def start(self) -> "SharedServices":
        """Open the shared LoadMonitor and CloudClient (idempotent); returns them."""
        if self.services is None:
            from edge_runtime.serving.services import SharedServices

            self.services = SharedServices.open(self.runtime, self._load_config, self._cloud_config)
        return self.services

    async def load_all(self) -> None:
        """Load every model on disk; a model that fails is logged and listed in the index, not fatal."""
        for name in self.names_on_disk():
            try:
                await self.load(name)
            except EdgeRuntimeError as exc:
                log.error("model %s not loaded: %s", name, exc)

    async def load(self, name: str) -> list[int]:
        """(Re)load ``name``; returns the versions now served. On failure the old versions keep serving."""
        check_model_name(name)
        self.start()
        async with self._lock:
            try:
                fresh = await asyncio.to_thread(self._compile, name)
            except EdgeRuntimeError as exc:
                self._failures[name] = str(exc)
                raise
            for loaded in fresh.values():
                await loaded.dispatcher.start()
            old = self._served.get(name, {})
            self._served[name] = fresh
            self._failures.pop(name, None)
            self._retire(old.values())
            log.info("model %s: serving version(s) %s on %s", name, sorted(fresh),
                     sorted({v.model.backend for v in fresh.values()}))
            return sorted(fresh)

    async def unload(self, name: str) -> None:
        """Stop serving ``name``; queued requests finish (drain) before its models close."""
        check_model_name(name)
        async with self._lock:
            old = self._served.pop(name, None)
            if old is None:
                raise ModelNotFoundError(f"model {name!r} is not loaded; served models: {sorted(self._served)}")
            self._retire(old.values())
            log.info("model %s: unloaded", name)

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Triton's repository index: one entry per version on disk or served."""
        entries = []
        for name in sorted(set(self.names_on_disk()) | set(self._served)):
            served = self._served.get(name, {})
            for version in sorted(set(self.versions_on_disk(name)) | set(served)):
                if version in served:
                    entries.append({"name": name, "version": str(version), "state": "READY", "reason": ""})
                elif not ready_only:
                    reason = self._failures.get(name) or ("not selected by version_policy" if served else "unloaded")
                    entries.append({"name": name, "version": str(version), "state": "UNAVAILABLE",
                                    "reason": reason})
        return entries

    async def close(self) -> None:
        """Unload everything, draining each queue for at most the drain timeout."""
        async with self._lock:
            for name in list(self._served):
                self._retire(self._served.pop(name).values())
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
        if self.services is not None:
            await asyncio.to_thread(self.services.close)
            self.services = None

    # -- internals ---------------------------------------------------------------------
    def _compile(self, name: str) -> dict[int, LoadedVersion]:
        """Worker thread: compile the chosen versions and build their dispatchers, all or none."""
        config, serving, selected = self._read(name)
        loaded: dict[int, LoadedVersion] = {}
        try:
            for version in selected:
                path = model_file(self.root / name / str(version))
                loaded[version] = self._build(name, version, path, config, serving)
        except BaseException:
            for version in loaded.values():
                _close_unstarted(version)
            raise
        return loaded

    def _build(self, name: str, version: int, path: Path, config: ModelConfig,
               serving: ServingConfig) -> LoadedVersion:
        """One version, with the resident memory its load added (loads run one at a time, so the
        process's RSS growth is this model's: sessions, weights, plans, arenas warmed by the probe)."""
        before = _rss_bytes()
        loaded = self._build_version(name, version, path, config, serving)
        added = max(_rss_bytes() - before, path.stat().st_size if path.is_file() else 0)
        return dataclasses.replace(loaded, memory_bytes=added)

    def _build_version(self, name: str, version: int, path: Path, config: ModelConfig,
                       serving: ServingConfig) -> LoadedVersion:
        services = self.start()
        if is_generative_folder(path.parent):  # a decoder LLM folder: served by the generation routes
            from edge_runtime.server.generation_serving import generative_version

            return generative_version(name, version, path.parent, config, serving, self.runtime, services)
        try:
            model = self.runtime.load(path, name=name, backend=serving.backend, options=serving_options(self.runtime))
        except CANNOT_LOAD_HERE as exc:
            # build_dispatcher re-raises exc unless the model's [cloud] section lets the peer answer alone.
            dispatcher = build_dispatcher(name, path, None, config, self.runtime, services, local_error=exc)
            try:
                stand_in = remote_model(name, path, str(exc))
            except ModelLoadError:
                raise exc from None  # no ONNX signature to serve it by (a .tflite file)
            return LoadedVersion(name, version, stand_in, dispatcher, config, serving)
        try:
            extra = self._extra_plans(model) if self._extra_plans is not None else None
            dispatcher = build_dispatcher(name, path, model, config, self.runtime, services, extra)
        except BaseException:
            model.close()
            raise
        return LoadedVersion(name, version, model, dispatcher, config, serving)

    def _read(self, name: str) -> tuple[ModelConfig, ServingConfig, list[int]]:
        directory = self.root / name
        if not directory.is_dir():
            raise ModelNotFoundError(f"no model {name!r} in repository {self.root}")
        config_path = directory / "config.toml"
        config = load_model_config(config_path) if config_path.is_file() else ModelConfig()
        serving_table = config.extra.get("serving", {})
        if not isinstance(serving_table, Mapping):
            raise ConfigError(f"{config_path}: [serving] must be a table")
        serving = from_mapping(ServingConfig, serving_table, f"{config_path}: [serving]")
        on_disk = self.versions_on_disk(name)
        if not on_disk:
            raise ModelNotFoundError(f"model {name!r}: no version folders (1, 2, ...) in {directory}")
        return config, serving, serving.select(name, on_disk)

    def _retire(self, versions: Any) -> None:
        for version in versions:
            task = asyncio.get_running_loop().create_task(self._drain(version))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _drain(self, version: LoadedVersion) -> None:
        await version.dispatcher.close(self._drain_timeout_s)
        version.model.close()


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _close_unstarted(version: LoadedVersion) -> None:
    """Free a version built but never served (a later version of the same load failed)."""
    version.dispatcher.discard()
    version.model.close()
