"""Typed cloud settings: the server-wide ``[cloud]`` table and the per-model ``[cloud]`` section.

Server-wide (``edge-runtime serve --config FILE.toml``)::

    [cloud]
    url = "https://inference.example.com"   # base URL of a KServe v2 server
    token_env = "EDGE_RUNTIME_CLOUD_TOKEN"   # env var holding the bearer token (never the token itself)
    timeout_ms = 2000                        # whole call, connect + send + compute + receive
    connect_timeout_ms = 500                 # connecting only: a refused/slow connect is safe to retry
    ca_file = "/etc/edge/ca.pem"             # extra CA bundle; TLS verification is always on
    binary_tensors = true                    # binary tensor extension (false for JSON-only servers)
    max_connections = 8                      # connection pool size
    retries = 2                              # re-tries of calls that surely never reached the peer
    retry_backoff_ms = 50                    # first back-off, doubled per retry
    breaker_failures = 3                     # consecutive failures that open the circuit breaker
    breaker_reset_ms = 5000                  # open this long, then one probe (half-open)

Per model (``<repository>/<model>/config.toml``; lands in ``ModelConfig.extra``)::

    [cloud]
    mode = "fallback"          # "never" | "fallback" | "split" | "always"
    remote_model = "resnet"    # the model's name on the cloud server (for "split": the tail)
    split_at = "auto"          # "split" mode: "auto" or a tensor name
    latency_target_ms = 50     # "fallback": go to the cloud when the local estimate exceeds it (0 = off)
    cloud_speedup = 0          # how much faster the peer computes than this device; 0 = learn it from
                               # the peer's reported compute time (edge-runtime peers report it)
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from edge_runtime.config import from_mapping
from edge_runtime.errors import ConfigError

MODES = ("never", "fallback", "split", "always")


@dataclass(frozen=True)
class CloudConfig:
    """How to reach the cloud peer. ``token`` is resolved from ``token_env`` by :func:`cloud_config`."""

    url: str
    token_env: str = "EDGE_RUNTIME_CLOUD_TOKEN"
    timeout_ms: int = 2000
    connect_timeout_ms: int = 500
    ca_file: Path | None = None
    binary_tensors: bool = True
    max_connections: int = 8
    retries: int = 2
    retry_backoff_ms: int = 50
    breaker_failures: int = 3
    breaker_reset_ms: int = 5000
    token: str | None = None

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"[cloud] url must be http(s)://host[:port][/path], got {self.url!r}")
        for key in ("timeout_ms", "connect_timeout_ms", "max_connections", "breaker_failures"):
            if getattr(self, key) < 1:
                raise ConfigError(f"[cloud] {key} must be >= 1, got {getattr(self, key)}")
        for key in ("retries", "retry_backoff_ms", "breaker_reset_ms"):
            if getattr(self, key) < 0:
                raise ConfigError(f"[cloud] {key} must be >= 0, got {getattr(self, key)}")
        if self.ca_file is not None and not Path(self.ca_file).is_file():
            raise ConfigError(f"[cloud] ca_file {str(self.ca_file)!r} does not exist")

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/")

    @property
    def is_tls(self) -> bool:
        return urlsplit(self.url).scheme == "https"


@dataclass(frozen=True)
class CloudModelConfig:
    """One model's cloud behaviour (see the module docstring). ``mode = "never"`` is the default."""

    mode: str = "never"
    remote_model: str = ""
    split_at: str = "auto"
    latency_target_ms: float = 0.0
    cloud_speedup: float = 0.0

    def __post_init__(self) -> None:
        if self.cloud_speedup < 0:
            raise ConfigError(f"[cloud] cloud_speedup must be >= 0 (0 = measure), got {self.cloud_speedup}")
        if self.mode not in MODES:
            raise ConfigError(f"[cloud] mode must be one of {MODES}, got {self.mode!r}")
        if self.mode != "never" and not self.remote_model:
            raise ConfigError(f"[cloud] mode {self.mode!r} needs remote_model (the model's name on the cloud server)")
        if not self.split_at:
            raise ConfigError("[cloud] split_at must be 'auto' or a tensor name, got ''")
        if self.latency_target_ms < 0:
            raise ConfigError(f"[cloud] latency_target_ms must be >= 0, got {self.latency_target_ms}")


def cloud_config(data: Mapping[str, Any], env: Mapping[str, str] | None = None,
                 where: str = "config") -> CloudConfig:
    """The server-wide ``[cloud]`` table, with the token read from the variable ``token_env`` names.

    Raises ConfigError naming the key for an unknown key or a bad value.
    """
    env = os.environ if env is None else env
    if "token" in data:
        raise ConfigError(f"{where}: [cloud] takes no 'token' (keep secrets out of files): "
                          "set token_env to the name of an environment variable holding it")
    config = from_mapping(CloudConfig, data, f"{where}: [cloud]")
    token = env.get(config.token_env) or None
    return dataclasses.replace(config, token=token)


def model_cloud_config(extra: Mapping[str, Any], where: str = "model config") -> CloudModelConfig:
    """The per-model ``[cloud]`` section out of ``ModelConfig.extra`` (absent: ``mode = "never"``)."""
    table = extra.get("cloud", {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: [cloud] must be a table")
    return from_mapping(CloudModelConfig, table, f"{where}: [cloud]")

