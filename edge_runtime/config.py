"""Typed configuration: frozen dataclasses built once from TOML plus ``EDGE_RUNTIME_*``.

Nothing below the runtime facade reads ``os.environ``; the facade builds a
``RuntimeConfig`` here and passes it down. Unknown keys and values of the
wrong type are errors (``ConfigError`` naming the file, section and key), not
silently ignored.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, TypeVar

from backends.base import DelegateSpec
from edge_runtime.errors import ConfigError

T = TypeVar("T")


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$EDGE_RUNTIME_CACHE``, else ``~/.cache/edge-runtime``."""
    env = os.environ if env is None else env
    if env.get("EDGE_RUNTIME_CACHE"):
        return Path(env["EDGE_RUNTIME_CACHE"]).expanduser()
    return Path.home() / ".cache" / "edge-runtime"


@dataclass(frozen=True)
class RuntimeConfig:
    """Process-wide settings of a ``Runtime``.

    ``intra_op_threads`` 0 means "usable cores from the device profile"
    (cgroup quota respected). ``probe_root`` lets tests probe a fake tree.
    ``delegates`` are TFLite external delegates to try, in order, before the
    catalogue's suggestion. ``backend_order`` (e.g. ``("ncnn", "cpu")``)
    replaces the matched catalogue entry's backend order.
    """

    cache_dir: Path = field(default_factory=default_cache_dir)
    intra_op_threads: int = 0
    precision: str = "fp32"
    probe_root: str = "/"
    probe_opencl: bool = True
    delegates: tuple[DelegateSpec, ...] = ()
    backend_order: tuple[str, ...] = ()  # overrides the catalogue's order when not empty

    def __post_init__(self) -> None:
        if self.precision not in ("fp32", "fp16"):
            raise ConfigError(f"runtime.precision must be 'fp32' or 'fp16', got {self.precision!r}")
        from backends.descriptors import DESCRIPTORS

        unknown = [b for b in self.backend_order if b not in DESCRIPTORS or not DESCRIPTORS[b].selectable]
        if unknown:
            selectable = sorted(n for n, d in DESCRIPTORS.items() if d.selectable)
            raise ConfigError(f"runtime.backend_order names unknown backend(s) {unknown}; known: {selectable}")
        if self.intra_op_threads < 0:
            raise ConfigError(f"runtime.intra_op_threads must be >= 0, got {self.intra_op_threads}")


# Environment variable -> (field, parser). The one place the environment is read.
_ENV_OVERRIDES: dict[str, tuple[str, Any]] = {
    "EDGE_RUNTIME_CACHE": ("cache_dir", lambda v: Path(v).expanduser()),
    "EDGE_RUNTIME_THREADS": ("intra_op_threads", int),
    "EDGE_RUNTIME_PRECISION": ("precision", str),
    "EDGE_RUNTIME_PROBE_ROOT": ("probe_root", str),
    "EDGE_RUNTIME_BACKENDS": ("backend_order", lambda v: [b.strip() for b in v.split(",") if b.strip()]),
}


def runtime_config(data: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                   where: str = "config") -> RuntimeConfig:
    """Build a RuntimeConfig from a ``[runtime]`` table and the environment (env wins)."""
    env = os.environ if env is None else env
    values = dict(data or {})
    if "delegates" in values:
        values["delegates"] = tuple(_delegate(d, f"{where}: runtime.delegates") for d in values["delegates"])
    for var, (key, parse) in _ENV_OVERRIDES.items():
        if env.get(var):
            try:
                values[key] = parse(env[var])
            except ValueError as exc:
                raise ConfigError(f"environment {var}={env[var]!r}: {exc}") from exc
    return from_mapping(RuntimeConfig, values, f"{where}: [runtime]")


def _delegate(item: Any, where: str) -> DelegateSpec:
    if not isinstance(item, Mapping) or "library" not in item:
        raise ConfigError(f"{where}: each delegate needs a 'library' key, got {item!r}")
    options = item.get("options", {})
    return DelegateSpec(str(item["library"]), tuple((str(k), str(v)) for k, v in options.items()))


def load_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a TOML file; errors name the file and the parser's complaint."""
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def from_mapping(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """Instantiate dataclass ``cls`` from ``data``, checking keys and simple types."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in data.items():
        values[key] = _coerce(value, hints[key], f"{where}.{key}")
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is not type(None):
                try:
                    return _coerce(value, option, where)
                except ConfigError:
                    continue
        raise ConfigError(f"{where}: {value!r} does not fit {hint}")
    if hint is Path:
        if isinstance(value, (str, Path)):
            return Path(value).expanduser()
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint in (str, bool):
        if isinstance(value, hint):
            return value
    elif origin is tuple:
        if isinstance(value, (list, tuple)):
            return tuple(value)
    else:
        return value  # nested types are validated by the dataclass itself
    raise ConfigError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {value!r}")
