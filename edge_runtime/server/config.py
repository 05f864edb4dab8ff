"""Server settings: the ``[server]``, ``[runtime]``, ``[load]`` and ``[cloud]`` tables of ``--config FILE.toml``.

```toml
[server]
host = "127.0.0.1"          # any other address needs a token
port = 8080
grpc_port = 8001            # KServe v2 gRPC beside HTTP (the grpc extra; default: off)
token_env = "EDGE_RUNTIME_TOKEN"   # or token = "..." (the file then holds a secret)
model_repository = "/data/models"  # default: serve the demo model
max_body_bytes = 67108864   # larger bodies get 413
overload_status = 429       # or 503; always with Retry-After
retry_after_s = 1
drain_timeout_s = 10.0      # SIGTERM: finish in-flight work for at most this long
task_ttl_s = 600.0          # async task results kept this long after they finish
max_tasks = 256             # async tasks kept at once (oldest finished evicted first)
max_task_bytes = 67108864   # bytes of kept async results (oldest finished evicted first)
default_priority_level = 5  # Triton: requests without a priority get this level
responses_store_bytes = 16777216  # Responses API answers kept for previous_response_id (0: none)
[runtime]
intra_op_threads = 0
[load]                      # the server's one LoadMonitor (edge_runtime.load_monitor.LoadConfig)
sample_interval_ms = 250
pin_gpu_busy = 0.9          # override a reading (operators, tests): pin_cpu_busy, pin_mem_used_fraction
[memory]                    # daemon-wide budget (edge_runtime.memory_budget.MemoryConfig)
budget_bytes = 0            # 0 = none; else idle models are unloaded, least recently used first
lazy_load = false           # true: a model loads on its first request
[cloud]                     # the cloud peer every model may use (edge_runtime.cloud.config.CloudConfig)
url = "https://inference.example.com"
token_env = "EDGE_RUNTIME_CLOUD_TOKEN"
```
Precedence: command line > ``EDGE_RUNTIME_<KEY>`` environment (``EDGE_RUNTIME_PORT``,
``EDGE_RUNTIME_HOST``, ...) > file > defaults. The token comes from ``token``, else
from the environment variable named by ``token_env``; the cloud token only from the
variable ``[cloud] token_env`` names. Without ``[cloud]`` no model goes to a cloud.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from edge_runtime.cloud.config import CloudConfig, cloud_config
from edge_runtime.config import RuntimeConfig, from_mapping, load_toml, runtime_config
from edge_runtime.errors import ConfigError
from edge_runtime.load_monitor import LoadConfig, load_config
from edge_runtime.memory_budget import MemoryConfig, memory_config

TABLES = ("cloud", "load", "memory", "runtime", "server")

MIB = 1024 * 1024


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    grpc_port: int | None = None  # None: no gRPC service; 0: any free port
    token: str | None = field(default=None, repr=False)  # a secret: never in logs or reprs
    token_env: str = "EDGE_RUNTIME_TOKEN"
    model_repository: Path | None = None
    max_body_bytes: int = 64 * MIB
    overload_status: int = 429
    retry_after_s: int = 1
    drain_timeout_s: float = 10.0
    task_ttl_s: float = 600.0
    max_tasks: int = 256
    max_task_bytes: int = 64 * MIB
    default_priority_level: int = 5
    responses_store_bytes: int = 16 * MIB  # Responses API responses kept for previous_response_id (0: none)

    def __post_init__(self) -> None:
        if self.overload_status not in (429, 503):
            raise ConfigError(f"[server] overload_status must be 429 or 503, got {self.overload_status}")
        for key in ("port", "grpc_port"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535):
                raise ConfigError(f"[server] {key} must be in 0..65535, got {value!r}")
        for key in ("max_body_bytes", "max_tasks", "max_task_bytes", "default_priority_level"):
            if getattr(self, key) < 1:
                raise ConfigError(f"[server] {key} must be >= 1, got {getattr(self, key)}")
        for key in ("retry_after_s", "drain_timeout_s", "task_ttl_s", "responses_store_bytes"):
            if getattr(self, key) < 0:
                raise ConfigError(f"[server] {key} must be >= 0, got {getattr(self, key)}")
        if self.token is not None and not self.token.strip():
            raise ConfigError("[server] token must not be empty")

    @property
    def is_loopback(self) -> bool:
        return is_loopback(self.host)


@dataclass(frozen=True)
class Settings:
    server: ServerConfig
    runtime: RuntimeConfig
    load: LoadConfig = field(default_factory=LoadConfig)
    cloud: CloudConfig | None = None  # None: no cloud peer configured
    memory: MemoryConfig = field(default_factory=MemoryConfig)  # [memory]: budget, lazy load


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost``, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name could resolve anywhere: treat it as public


_NOT_FROM_ENV = ("token", "token_env")  # the token is read through token_env, never EDGE_RUNTIME_TOKEN_ENV


def load_settings(config_path: Path | None = None, overrides: Mapping[str, Any] | None = None,
                  env: Mapping[str, str] | None = None) -> Settings:
    """Build the settings once at start; raises ConfigError naming the key.

    ``overrides`` are command-line values (None = not given). Refuses a
    non-loopback ``host`` without a token.
    """
    env = os.environ if env is None else env
    document = load_toml(config_path) if config_path else {}
    where = str(config_path or "settings")
    unknown = sorted(set(document) - set(TABLES))
    if unknown:
        raise ConfigError(f"{where}: unknown table(s) {unknown}; known: {list(TABLES)}")
    for table in TABLES:
        if not isinstance(document.get(table, {}), Mapping):
            raise ConfigError(f"{where}: [{table}] must be a table")
    values = dict(document.get("server", {}))
    values.update(_env_values(env))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    server = from_mapping(ServerConfig, values, f"{where}: [server]")
    if server.token is None and env.get(server.token_env):
        server = dataclasses.replace(server, token=env[server.token_env])
    if server.model_repository is not None and not server.model_repository.is_dir():
        raise ConfigError(f"model repository {server.model_repository} is not a directory")
    if server.grpc_port is not None and not _has_grpc():
        raise ConfigError("[server] grpc_port needs the grpc extra: pip install 'edge-runtime[grpc]' "
                          "(grpcio and tritonclient's KServe v2 gRPC messages)")
    if not server.is_loopback and server.token is None:
        raise ConfigError(
            f"refusing to listen on {server.host!r} without a token: set [server] token, or the "
            f"{server.token_env} environment variable (clients then send 'Authorization: Bearer <token>')")
    cloud = cloud_config(document["cloud"], env=env, where=where) if "cloud" in document else None
    return Settings(server, runtime_config(document.get("runtime", {}), env=env, where=where),
                    load_config(document.get("load"), where=where), cloud,
                    memory_config(document.get("memory"), where))


def _has_grpc() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("grpc", "tritonclient.grpc"))


def _env_values(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for spec in dataclasses.fields(ServerConfig):
        if spec.name in _NOT_FROM_ENV:
            continue
        var = f"EDGE_RUNTIME_{spec.name.upper()}"
        if not env.get(var):
            continue
        parse = {"int": int, "int | None": int, "float": float}.get(str(spec.type), str)
        try:
            values[spec.name] = parse(env[var])
        except ValueError as exc:
            raise ConfigError(f"environment {var}={env[var]!r}: {exc}") from exc
    return values
