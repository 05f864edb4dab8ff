"""What a served model version gets at load besides its dispatcher: warm-up, a result cache, its charge.

``prepare_version`` reads the model's ``[warmup]``, ``[result_cache]`` and
``[shape_buckets]`` tables, warms up every local plan (blocking: call it in
the load's worker thread; without ``[warmup] shapes``, on the bucket sizes)
and returns the result cache (None when off) and the buckets. ``footprint_bytes`` is
the memory-budget charge of a set of model files. The server calls these
from its repository; nothing here knows HTTP.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from backends.base import TensorSpec
from edge_runtime.result_cache import ResultCache, result_cache_config
from edge_runtime.shape_buckets import ShapeBuckets, shape_buckets_config
from edge_runtime.warmup import WarmupReport, warm_up, warmup_config

# Per-model config tables owned here (the scheduler's model config keeps them in ``extra``).
TABLES = ("warmup", "result_cache", "shape_buckets")


@dataclass(frozen=True)
class VersionExtras:
    warmup: WarmupReport
    result_cache: ResultCache | None
    buckets: ShapeBuckets = ShapeBuckets()


def prepare_version(plans: Mapping[str, Any], specs: Sequence[TensorSpec], extra: Mapping[str, Any],
                    where: str) -> VersionExtras:
    """Warm up the local plans (cloud plans are left alone) and build the result cache.

    Raises ConfigError for a bad table, InvalidInputError for warm-up shapes
    the model does not take, and what a plan raises while warming up.
    """
    cache_config = result_cache_config(extra.get("result_cache"), where)
    buckets = shape_buckets_config(extra.get("shape_buckets"), specs, where)
    warmup = warmup_config(extra.get("warmup"), where)
    if not warmup.shapes and buckets.dims:
        warmup = dataclasses.replace(warmup, shapes=buckets.warmup_shapes(specs))
    local = {name: plan for name, plan in plans.items() if "cloud" not in getattr(plan, "backends", ())}
    report = warm_up(local, specs, warmup)
    return VersionExtras(report, ResultCache(cache_config) if cache_config.enabled else None, buckets)


def footprint_bytes(paths: Iterable[Path], factor: float) -> int:
    """The budget charge of these model files: their size times ``factor`` (see memory_budget)."""
    return int(sum(Path(p).stat().st_size for p in paths) * factor)
