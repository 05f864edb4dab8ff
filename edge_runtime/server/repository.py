"""A Triton-style model repository and the versions of it being served.

Layout::

    <root>/<model>/config.toml          optional: [scheduler] [batching] [queue] [serving] ...
    <root>/<model>/<version>/model.onnx (or model.tflite); version = a positive integer

``[serving]`` (this module's section of the per-model config)::

    backend = "auto"           # or "cpu", "opencl", "tflite", "null"
    version_policy = "latest"  # "latest" (highest version only), "all", or a list: [1, 3]

A (re)load compiles every chosen version first and swaps them in only when all
succeeded, so a failed reload leaves the old versions serving. Versions taken
out of service drain their queues before their models close.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from edge_runtime.config import from_mapping
from edge_runtime.errors import ConfigError, EdgeRuntimeError, InvalidInputError, ModelLoadError, ModelNotFoundError
from edge_runtime.scheduler import ModelConfig, ModelScheduler, model_plans
from edge_runtime.scheduler.config import load_model_config

if TYPE_CHECKING:
    from edge_runtime.model import Model
    from edge_runtime.runtime import Runtime
    from edge_runtime.scheduler.plans import Plan

log = logging.getLogger(__name__)

MODEL_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
MODEL_FILES = ("model.onnx", "model.tflite")


def check_model_name(name: str) -> str:
    """``name`` if it is a safe model name (``^[A-Za-z0-9_.-]+$``, not only dots), else InvalidInputError."""
    if not MODEL_NAME.fullmatch(name) or set(name) == {"."}:
        raise InvalidInputError(f"invalid model name {name!r}: use letters, digits, '_', '.', '-' (not only dots)")
    return name


def parse_version(text: str) -> int:
    """A version from a URL; InvalidInputError unless a positive integer."""
    if not text.isdigit() or int(text) < 1:
        raise InvalidInputError(f"invalid model version {text!r}: versions are positive integers")
    return int(text)


@dataclass(frozen=True)
class ServingConfig:
    backend: str = "auto"
    version_policy: str | tuple[int, ...] = "latest"

    def __post_init__(self) -> None:
        if isinstance(self.version_policy, str) and self.version_policy not in ("latest", "all"):
            raise ConfigError(f"[serving] version_policy must be 'latest', 'all' or a list of versions, "
                              f"got {self.version_policy!r}")

    def select(self, name: str, on_disk: list[int]) -> list[int]:
        if self.version_policy == "latest":
            return on_disk[-1:]
        if self.version_policy == "all":
            return list(on_disk)
        missing = sorted(set(self.version_policy) - set(on_disk))
        if missing:
            raise ModelNotFoundError(f"model {name!r}: version_policy names version(s) {missing}, "
                                     f"the repository has {on_disk}")
        return sorted(set(self.version_policy))


@dataclass(frozen=True)
class LoadedVersion:
    """One served version: its model, its scheduler, the config it was loaded with."""

    name: str
    version: int
    model: "Model"
    scheduler: ModelScheduler
    config: ModelConfig
    serving: ServingConfig


PlansFor = Callable[["Model"], Mapping[str, "Plan"]]


class ModelRepository:
    """Loads, serves and unloads the models of one repository directory (event-loop side)."""

    def __init__(self, root: Path, runtime: "Runtime", *, plans_for: PlansFor = model_plans,
                 drain_timeout_s: float = 10.0) -> None:
        self.root = Path(root)
        self.runtime = runtime
        self._plans_for = plans_for
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
        async with self._lock:
            try:
                config, serving, models = await asyncio.to_thread(self._compile, name)
            except EdgeRuntimeError as exc:
                self._failures[name] = str(exc)
                raise
            fresh = {}
            for version, model in models.items():
                scheduler = ModelScheduler(name, model.inputs, self._plans_for(model), config, None)
                await scheduler.start()
                fresh[version] = LoadedVersion(name, version, model, scheduler, config, serving)
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

    # -- internals ---------------------------------------------------------------------
    def _compile(self, name: str) -> tuple[ModelConfig, ServingConfig, dict[int, "Model"]]:
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
        models: dict[int, Model] = {}
        try:
            for version in serving.select(name, on_disk):
                models[version] = self.runtime.load(_model_file(directory / str(version)), name=name,
                                                    backend=serving.backend)
        except BaseException:
            for model in models.values():
                model.close()
            raise
        return config, serving, models

    def _retire(self, versions: Any) -> None:
        for version in versions:
            task = asyncio.get_running_loop().create_task(self._drain(version))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _drain(self, version: LoadedVersion) -> None:
        await version.scheduler.close(self._drain_timeout_s)
        version.model.close()


def _model_file(version_dir: Path) -> Path:
    for file_name in MODEL_FILES:
        if (version_dir / file_name).is_file():
            return version_dir / file_name
    raise ModelLoadError(f"{version_dir}: no {' or '.join(MODEL_FILES)}")


def demo_repository(cache_dir: Path) -> Path:
    """A one-model repository serving the demo CNN as ``demo`` version 1 (built on first use)."""
    from edge_runtime.demo import demo_model_path

    source = demo_model_path(cache_dir)
    root = Path(cache_dir) / "server" / "demo-repository"
    target = root / "demo" / "1" / "model.onnx"
    if not target.is_file() or target.stat().st_size != source.stat().st_size:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        shutil.copyfile(source, tmp)
        tmp.replace(target)
    return root
