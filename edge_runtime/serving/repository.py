"""A Triton-style model repository and the versions of it being served.

Layout::

    <root>/<model>/config.toml          optional: [scheduler] [batching] [queue] [cloud] [serving]
    <root>/<model>/<version>/model.onnx (or model.tflite, or a generative folder); version = a positive integer
    <root>/<model>/model.onnx           a model folder without version folders (as downloaded): version 1

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
from edge_runtime.serving.layout import (
    MODEL_NAME,
    ServingConfig,
    check_model_name,
    holds_model,
    is_decimal,
    model_file,
)

if TYPE_CHECKING:
    from edge_runtime.cloud.config import CloudConfig
    from edge_runtime.load_extras import VersionExtras
    from edge_runtime.load_monitor import LoadConfig
    from edge_runtime.memory_budget import MemoryConfig
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
    extras: "VersionExtras | None" = None  # warm-up report and result cache (edge_runtime.load_extras)
    charge: Mapping[str, int] | None = None  # its memory-budget parts as allocated (generative); None: as planned

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
                 drain_timeout_s: float = 10.0, memory: "MemoryConfig | None" = None) -> None:
        from edge_runtime.memory_budget import MemoryBudget, MemoryConfig

        self.root = Path(root)
        self.memory = memory or MemoryConfig()
        self.budget = MemoryBudget(self.memory.budget_bytes)  # see edge_runtime.memory_budget
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
        self._lazy_loads: dict[str, asyncio.Future] = {}

    # -- what is on disk ---------------------------------------------------------------
    def names_on_disk(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and MODEL_NAME.fullmatch(p.name) and self.versions_on_disk(p.name))

    def versions_on_disk(self, name: str) -> list[int]:
        """The version folders of ``name`` (``<root>/<name>/<n>/``); a folder that holds a model's files
        itself and has no version folder — the layout users download (Hugging Face, transformers.js,
        MLServer) — is version 1."""
        directory = self.root / name
        if not directory.is_dir():
            return []
        numbered = sorted(int(p.name) for p in directory.iterdir()
                          if p.is_dir() and is_decimal(p.name) and int(p.name) > 0)
        return numbered or ([1] if holds_model(directory) else [])

    def version_dir(self, name: str, version: int) -> Path:
        """Where version ``version`` of ``name`` lies: its numbered folder, or the model's folder itself."""
        numbered = self.root / name / str(version)
        return numbered if numbered.is_dir() else self.root / name

    def misplaced(self) -> str | None:
        """Why nothing is served when the root itself is a model folder (``--model-repository``
        pointed at one model, not at the folder holding it), or None."""
        if not self.root.is_dir() or not holds_model(self.root):
            return None
        return (f"the model repository {self.root} is itself a model folder: serve the folder that holds it "
                f"(<repository>/{self.root.name}/)")

    # -- serving -----------------------------------------------------------------------
    def get(self, name: str, version: int | None = None) -> LoadedVersion:
        """The served version (highest when ``version`` is None); ModelNotFoundError names what is served."""
        versions = self._served.get(name)
        if not versions:
            misplaced = self.misplaced()  # on a miss only: a hit reads no disk
            raise ModelNotFoundError(f"unknown model {name!r}; served models: {sorted(self._served)}"
                                     + (f"; {misplaced}" if misplaced else ""))
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
        if why := self.misplaced():
            log.warning("not served: %s", why)
        if self.memory.lazy_load:
            log.info("[memory] lazy_load: models load on their first request")
            return
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
                planned = await asyncio.to_thread(self._plan, name)  # reads a decoder's graph: off the loop
                self._make_room(name, planned)
                fresh = await asyncio.to_thread(self._compile, name)
            except EdgeRuntimeError as exc:
                self._failures[name] = str(exc)
                raise
            parts = _sum_parts(v.charge if v.charge is not None else planned[n] for n, v in fresh.items())
            if parts != _sum_parts(planned.values()):
                log.warning("model %s: allocated %s bytes, planned %s; charging what was allocated",
                            name, parts, _sum_parts(planned.values()))
            self.budget.charge(name, sum(parts.values()), sum(v.memory_bytes for v in fresh.values()), parts)
            for loaded in fresh.values():
                await loaded.dispatcher.start()
                await _warm_request_path(loaded)
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
            self.budget.release(name)
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
        why = self.misplaced() if not ready_only else None
        if why:  # Triton lists a model it cannot serve with its reason; so do we (no version to name)
            entries.append({"name": self.root.name, "state": "UNAVAILABLE", "reason": why})
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

    @property
    def loads_on_demand(self) -> bool:
        """True when a request may load its model (``lazy_load``, or a budget that unloads models)."""
        return self.memory.lazy_load or bool(self.memory.budget_bytes)

    def generative_on_disk(self) -> list[str]:
        """Models on disk with a generative version folder (a cheap scan: no ONNX is read)."""
        return [name for name in self.names_on_disk()
                if any(is_generative_folder(self.version_dir(name, v)) for v in self.versions_on_disk(name))]

    async def ensure_loaded(self, name: str) -> None:
        """Load ``name`` now if it is on disk, not served, and the memory settings load lazily
        (``lazy_load``, or a budget that unloaded it); otherwise do nothing (``get`` then answers)."""
        if name in self._served or not self.loads_on_demand:
            return
        if not MODEL_NAME.fullmatch(name) or not self.versions_on_disk(name):
            return
        # One load per model however many requests arrive while it compiles; each waits for it.
        task = self._lazy_loads.get(name)
        if task is None:
            task = asyncio.ensure_future(self.load(name))
            self._lazy_loads[name] = task
            task.add_done_callback(lambda _: self._lazy_loads.pop(name, None))
        await asyncio.shield(task)

    def _plan(self, name: str) -> dict[int, dict[str, int]]:
        """Worker thread: ``name``'s budget parts per chosen version, before anything is allocated.

        A tensor version is charged its ``weights`` (file size × ``footprint_factor``); a
        generative one adds its KV cache and prefix cache (``edge_runtime.generation.footprint``).
        Raises ModelLoadError when a generative model's charge exceeds the whole budget: it can
        never fit, and the message names the parts to shrink.
        """
        from edge_runtime.load_extras import footprint_bytes

        config, _, selected = self._read(name)
        factor = self.memory.footprint_factor
        planned: dict[int, dict[str, int]] = {}
        for version in selected:
            directory = self.version_dir(name, version)
            if is_generative_folder(directory):
                from edge_runtime.serving.generation_serving import planned_charge

                planned[version] = planned_charge(name, directory, config, factor, self.runtime.config.cache_dir)
            else:
                planned[version] = {"weights": footprint_bytes([model_file(directory)], factor)}
        parts = _sum_parts(planned.values())
        budget = self.budget.budget_bytes
        if budget and sum(parts.values()) > budget and "kv_cache" in parts:
            from edge_runtime.generation.footprint import GenerationFootprint

            described = GenerationFootprint(parts.get("weights", 0), parts.get("kv_cache", 0),
                                            parts.get("prefix_cache", 0), parts.get("image_cache", 0)).describe()
            vision = " ([vision] feature_cache_bytes)" if parts.get("image_cache") else ""
            raise ModelLoadError(f"model {name!r} needs {described} (version(s) {selected}), more than the whole "
                                 f"memory budget of {budget} bytes ([memory] budget_bytes): lower its [generation] "
                                 f"max_batch_size, max_seq_len or prefix_cache_bytes{vision}, or raise the budget")
        return planned

    def _make_room(self, name: str, planned: Mapping[int, Mapping[str, int]]) -> None:
        """Unload idle models (LRU) so ``planned`` fits; QueueFullError when busy models hold the room."""
        need = sum(sum(parts.values()) for parts in planned.values())
        for victim in self.budget.make_room(need, name):
            log.warning("memory budget: unloading idle model %s to load %s", victim, name)
            self._failures[victim] = "unloaded to fit the memory budget; it loads again on its next request"
            self.budget.release(victim)
            self._retire(self._served.pop(victim, {}).values())

    # -- internals ---------------------------------------------------------------------
    def _compile(self, name: str) -> dict[int, LoadedVersion]:
        """Worker thread: compile the chosen versions and build their dispatchers, all or none."""
        config, serving, selected = self._read(name)
        loaded: dict[int, LoadedVersion] = {}
        try:
            for version in selected:
                path = model_file(self.version_dir(name, version))
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
            from edge_runtime.serving.generation_serving import generative_version

            return generative_version(name, version, path.parent, config, serving, self.runtime, services,
                                      self.budget, self.memory.footprint_factor)
        try:
            model = self.runtime.load(path, name=name, backend=serving.backend,
                                      options=serving_options(self.runtime, config),
                                      input_shapes=_configured_shapes(config))
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
        try:
            from edge_runtime.load_extras import prepare_version

            plans = dispatcher.scheduler.plans if dispatcher.scheduler is not None else {}
            extras = prepare_version(plans, model.inputs, config.extra, str(self.root / name / "config.toml"))
        except BaseException:
            dispatcher.discard()
            model.close()
            raise
        return LoadedVersion(name, version, model, dispatcher, config, serving, extras=extras)

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


async def _warm_request_path(loaded: LoadedVersion) -> None:
    """After the plans' own warm-up, one request per plan through the version's scheduler (not the
    cloud router, not the statistics): see ``edge_runtime.warmup.warm_request_path``."""
    from edge_runtime.warmup import warm_request_path

    scheduler = loaded.dispatcher.scheduler
    if loaded.extras is not None and scheduler is not None:
        await warm_request_path(scheduler, loaded.model.inputs, loaded.extras.warmup)


def _configured_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]] | None:
    """The first ``[warmup] shapes`` set: the shape ``auto`` measures its candidates at (None: the
    runtime's own choice, ``edge_runtime.served_shapes``)."""
    from edge_runtime.warmup import warmup_config

    shapes = warmup_config(config.extra.get("warmup"), config.source).shapes
    return dict(shapes[0]) if shapes else None


def _sum_parts(parts: Any) -> dict[str, int]:
    """Budget parts of several versions added up, key by key."""
    total: dict[str, int] = {}
    for entry in parts:
        for key, value in entry.items():
            total[key] = total.get(key, 0) + value
    return total


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _close_unstarted(version: LoadedVersion) -> None:
    """Free a version built but never served (a later version of the same load failed)."""
    version.dispatcher.discard()
    version.model.close()
