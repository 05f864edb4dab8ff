"""Per-model serving configuration, with the spellings operators rely on.

```toml
[scheduler]
policy = "cost"            # "threshold" | "cost" | "fixed"
gpu_busy_threshold = 0.7   # threshold policy
plan = "cpu"               # fixed policy
explore_fraction = 0.05    # cost policy: share of decisions that re-try another plan
seed = 0                   # cost policy: exploration RNG seed (decisions are reproducible)
spin = "load"              # CPU pool threads spin while a run is in flight | "never" | "always" (spin.py)
spin_wait_us = 1000        # "load": longest one wait of a pool thread spins inside a run; 0 = ORT's own
inline_max_ms = 2.0        # an idle model's runs this short go on the event loop itself; 0 = never (inline.py)
single_thread = "auto"     # small cpu models: a one-thread session too, used where measured cheaper | "never"
[batching]
max_batch_size = 16        # rows per run; 0 or 1 = off
max_queue_delay_us = 2000  # how long the first request of a batch may wait for company
preferred_batch_sizes = [4, 8]
latency_target_ms = 0      # > 0: AIMD shrinks/grows the batch limit to keep runs under it
[queue]
max_queue_size = 64
default_timeout_ms = 0     # 0 = none
```
Read from ``<repository>/<model>/config.toml`` or passed to ``rt.load(..., config=...)``.
Other sections (``[cloud]``, ``[serving]``: ``OTHER_SECTIONS``) belong to their own features and are
kept as-is in ``extra``; any other table or top-level key is an error naming the file, table and key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from edge_runtime.config import from_mapping, load_toml
from edge_runtime.errors import ConfigError
from edge_runtime.scheduler.inline import INLINE_MAX_MS, MAX_INLINE_MAX_MS

POLICIES = ("threshold", "cost", "fixed")
SPIN_MODES = ("load", "never", "always")  # scheduler.spin: when CPU pool threads may busy-wait
SINGLE_THREAD_MODES = ("auto", "never")  # scheduler.single_thread (single_thread.py)
# "load": how long one wait of a pool thread spins inside a run (spin.py says why 1 ms).
SPIN_WAIT_US = 1000
MAX_SPIN_WAIT_US = 100_000  # 0.1 s: far past any gap inside a run of a served model


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "fixed"
    gpu_busy_threshold: float = 0.7
    plan: str = "auto"  # fixed policy: a plan name; "auto" = the model's default plan
    explore_fraction: float = 0.05  # cost policy: share of requests that re-try another plan
    seed: int = 0  # cost policy: exploration RNG seed, so decisions are reproducible
    spin: str = "load"  # when the model's CPU pool threads may busy-wait (scheduler.spin)
    spin_wait_us: int = SPIN_WAIT_US  # "load": bound on one spinning wait in a run; 0 = ORT's own (spin.py)
    inline_max_ms: float = INLINE_MAX_MS  # an idle model's runs this short go on the loop; 0 = never (inline.py)
    single_thread: str = "auto"  # small cpu models: a one-thread session beside the pool one (single_thread.py)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"[scheduler] policy must be one of {POLICIES}, got {self.policy!r}")
        if self.spin not in SPIN_MODES:
            raise ConfigError(f"[scheduler] spin must be one of {SPIN_MODES}, got {self.spin!r}")
        if self.single_thread not in SINGLE_THREAD_MODES:
            raise ConfigError(f"[scheduler] single_thread must be one of {SINGLE_THREAD_MODES}, "
                              f"got {self.single_thread!r}")
        if type(self.spin_wait_us) is not int or not 0 <= self.spin_wait_us <= MAX_SPIN_WAIT_US:
            raise ConfigError(f"[scheduler] spin_wait_us must be an integer in 0..{MAX_SPIN_WAIT_US} "
                              f"(microseconds), got {self.spin_wait_us!r}")
        if not 0.0 <= self.inline_max_ms <= MAX_INLINE_MAX_MS:
            raise ConfigError(f"[scheduler] inline_max_ms must be in 0..{MAX_INLINE_MAX_MS:g} (milliseconds), "
                              f"got {self.inline_max_ms!r}")
        if not 0.0 <= self.gpu_busy_threshold <= 1.0:
            raise ConfigError(f"[scheduler] gpu_busy_threshold must be in [0, 1], got {self.gpu_busy_threshold}")
        if not 0.0 <= self.explore_fraction <= 1.0:
            raise ConfigError(f"[scheduler] explore_fraction must be in [0, 1], got {self.explore_fraction}")


@dataclass(frozen=True)
class BatchingConfig:
    max_batch_size: int = 0  # 0 or 1 = off
    max_queue_delay_us: int = 2000
    preferred_batch_sizes: tuple[int, ...] = ()
    latency_target_ms: float = 0.0  # 0 = no adaptive sizing; see batching.BatchSizer

    def __post_init__(self) -> None:
        if self.max_batch_size < 0 or self.max_queue_delay_us < 0:
            raise ConfigError("[batching] max_batch_size and max_queue_delay_us must be >= 0")
        bad = [size for size in self.preferred_batch_sizes
               if not isinstance(size, int) or size < 1 or size > max(self.max_batch_size, 1)]
        if bad:
            raise ConfigError(f"[batching] preferred_batch_sizes must be in 1..max_batch_size "
                              f"({self.max_batch_size}), got {list(self.preferred_batch_sizes)}")
        if self.latency_target_ms < 0:
            raise ConfigError(f"[batching] latency_target_ms must be >= 0, got {self.latency_target_ms}")

    @property
    def enabled(self) -> bool:
        return self.max_batch_size > 1


@dataclass(frozen=True)
class QueueConfig:
    max_queue_size: int = 64
    default_timeout_ms: int = 0  # 0 = none

    def __post_init__(self) -> None:
        if self.max_queue_size < 1:
            raise ConfigError(f"[queue] max_queue_size must be >= 1, got {self.max_queue_size}")
        if self.default_timeout_ms < 0:
            raise ConfigError(f"[queue] default_timeout_ms must be >= 0, got {self.default_timeout_ms}")


@dataclass(frozen=True)
class ModelConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    extra: Mapping[str, Any] = field(default_factory=dict)  # sections owned by other features
    source: str = "model config"  # where it was read from (a config.toml path), for error messages


_SECTIONS = {"scheduler": SchedulerConfig, "batching": BatchingConfig, "queue": QueueConfig}
# Tables other features own and check themselves (kept in ``extra``); add a feature's table here.
OTHER_SECTIONS = ("cloud", "serving", "generation", "vision", "warmup", "result_cache", "shape_buckets")
# [generation]: edge_runtime.generation.settings; [warmup], [result_cache], [shape_buckets]: edge_runtime.load_extras


def model_config(data: Mapping[str, Any] | None = None, where: str = "model config") -> ModelConfig:
    """Build a ModelConfig from a parsed TOML document.

    Raises ConfigError naming ``where`` (the file), the table and the key for an
    unknown table, a top-level key outside any table, or an unknown key in a known table.
    """
    data = dict(data or {})
    known = [*_SECTIONS, *OTHER_SECTIONS]
    for key, value in data.items():
        if key not in known:
            what = f"unknown table [{key}]" if isinstance(value, Mapping) else f"unknown top-level key {key!r}"
            raise ConfigError(f"{where}: {what}; known tables: {', '.join(f'[{k}]' for k in known)}")
    sections = {}
    for name, cls in _SECTIONS.items():
        table = data.pop(name, {})
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: [{name}] must be a table")
        sections[name] = from_mapping(cls, table, f"{where}: [{name}]")
    return ModelConfig(**sections, extra=data, source=where)


def load_model_config(path: str | Path) -> ModelConfig:
    return model_config(load_toml(path), where=str(path))
