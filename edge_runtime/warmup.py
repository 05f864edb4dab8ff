"""Warm-up at load: run every plan once per configured sample shape before the model reports ready.

The first run of a plan pays what later runs do not: ONNX Runtime's arena
allocations and first-touch page faults, OpenCL's kernel build and tuning for
a new input shape (a specialisation), LiteRT's tensor allocation. Warm-up pays
them at load, so the first real request costs what the tenth does. Per
model, in its ``config.toml``::

    [warmup]
    enabled = true                 # default
    runs = 1                       # runs per plan and shape
    shapes = [{ input = [1, 3, 64, 64] }, { input = [1, 3, 128, 128] }]
    # or one set: shapes = { input = [1, 3, 48, 192] }
    # default: the model's static dims (dim 0 bound to 1); where another dim is
    # dynamic, the first request's shapes (deferred, below)

Never an arbitrary size for a dynamic spatial dim: a model's pooling may reject
it (PP-OCR's classifier takes no 1x1 image), and a plan's stage that fails at
load is a fallback nobody asked for. With no served shape known (see
``edge_runtime.served_shapes``) the report is ``deferred`` and
``warm_request_path`` arranges the warm-up at the first request's shapes, as
low-priority requests behind the real ones (off their critical path).

Inputs are seeded random data of the model's dtypes (empty strings for
BYTES). Configured shapes that do not fit the model fail the load (a
configuration mistake). A plan whose warm-up run raises is reported
(``errors``) but still served: random data may simply be no valid input
(token ids out of range), and the first real request then tells; it is a
WARNING for configured shapes, a DEBUG line for shapes taken from the model.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from backends.base import TensorSpec
from edge_runtime.config import from_mapping
from edge_runtime.errors import ConfigError, InvalidInputError
from edge_runtime.feeds import random_feeds
from edge_runtime.served_shapes import ShapeSet, served_shapes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmupConfig:
    enabled: bool = True
    runs: int = 1
    shapes: tuple[Mapping[str, Sequence[int]], ...] = ()

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ConfigError(f"[warmup] runs must be >= 1, got {self.runs}")


def warmup_config(table: Mapping[str, Any] | None, where: str) -> WarmupConfig:
    """The model's ``[warmup]`` table; ConfigError names ``where`` and the key."""
    if table is not None and not isinstance(table, Mapping):
        raise ConfigError(f"{where}: [warmup] must be a table")
    values = dict(table or {})
    shapes = values.pop("shapes", [])
    if isinstance(shapes, Mapping):  # one set: shapes = { input = [1, 3, 48, 192] }
        shapes = [shapes]
    if not isinstance(shapes, list) or not all(isinstance(s, Mapping) for s in shapes):
        raise ConfigError(f"{where}: [warmup] shapes must be a list of tables like {{ input = [1, 3, 64, 64] }}")
    for entry in shapes:
        for name, dims in entry.items():
            if not isinstance(dims, list) or not all(isinstance(d, int) and d > 0 for d in dims):
                raise ConfigError(f"{where}: [warmup] shapes: {name} must be a list of positive integers, "
                                  f"got {dims!r}")
    config = from_mapping(WarmupConfig, values, f"{where}: [warmup]")
    return WarmupConfig(config.enabled, config.runs, tuple({k: tuple(v) for k, v in s.items()} for s in shapes))


@dataclass(frozen=True)
class WarmupReport:
    """What warm-up ran: per plan, the first run's ms per shape set (the cost a request no longer pays)."""

    first_run_ms: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    shapes: tuple[Mapping[str, tuple[int, ...]], ...] = ()
    errors: Mapping[str, str] = field(default_factory=dict)  # plan -> why its warm-up run failed
    deferred: bool = False  # no served shape known at load: warmed at the first request's shapes
    runs: int = 1

    @property
    def done(self) -> bool:
        return bool(self.first_run_ms)

    def to_dict(self) -> dict[str, Any]:
        return {"done": self.done, "deferred": self.deferred,
                "first_run_ms": {k: list(v) for k, v in self.first_run_ms.items()},
                "shapes": [{k: list(v) for k, v in s.items()} for s in self.shapes], "errors": dict(self.errors)}


def sample_feeds(specs: Sequence[TensorSpec], shapes: Mapping[str, Sequence[int]], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs with ``shapes`` where given, else the static dims (dynamic dims 1)."""
    unknown = sorted(set(shapes) - {s.name for s in specs})
    if unknown:
        raise InvalidInputError(f"[warmup] shapes name unknown input(s) {unknown}; inputs: {[s.name for s in specs]}")
    bound = [TensorSpec(s.name, s.dtype, tuple(shapes[s.name])) if s.name in shapes else s for s in specs]
    for spec, given in zip(specs, bound):
        if len(given.shape) != len(spec.shape) or any(
                isinstance(d, int) and d >= 0 and d != g for d, g in zip(spec.shape, given.shape)):
            raise InvalidInputError(f"[warmup] shapes: input {spec.name!r} expects {list(spec.shape)}, "
                                    f"got {list(given.shape)}")
    strings = [s for s in bound if np.dtype(s.dtype).kind == "O"]
    feeds = random_feeds([s for s in bound if s not in strings], seed=seed)
    for spec in strings:  # BYTES tensors: empty strings
        feeds[spec.name] = np.full([d if isinstance(d, int) and d >= 0 else 1 for d in spec.shape], b"", dtype=object)
    return feeds


def warm_up(plans: Mapping[str, Any], specs: Sequence[TensorSpec], config: WarmupConfig) -> WarmupReport:
    """Run each plan (anything with ``run(feeds)``) ``config.runs`` times per shape set. Blocking.

    Raises InvalidInputError for shapes that do not fit the model; a plan
    that raises is reported in ``errors`` (see the module docstring).
    """
    if not config.enabled or not plans:
        return WarmupReport()
    shape_sets = served_shapes(specs, config.shapes)
    if not shape_sets:
        log.info("warm-up deferred to the first request: inputs %s have dynamic dims besides dim 0 and "
                 "[warmup] shapes names none", {s.name: list(s.shape) for s in specs})
        return WarmupReport(deferred=True, runs=config.runs)
    feeds_list = [sample_feeds(specs, shapes) for shapes in shape_sets]
    first: dict[str, tuple[float, ...]] = {}
    errors: dict[str, str] = {}
    for name, plan in plans.items():
        times = []
        try:
            for feeds in feeds_list:
                for run in range(config.runs):
                    started = time.perf_counter()
                    plan.run(feeds)
                    if run == 0:
                        times.append(round((time.perf_counter() - started) * 1e3, 3))
        except Exception as exc:  # any plan failure: reported, never fatal (see the module docstring)
            log.log(logging.WARNING if config.shapes else logging.DEBUG,
                    "warm-up: plan %s failed on seeded inputs (%s: %s); serving it unwarmed",
                    name, type(exc).__name__, exc)
            errors[name] = f"{type(exc).__name__}: {exc}"
            continue
        first[name] = tuple(times)
        log.info("warm-up: plan %s first runs %s ms", name, times)
    return WarmupReport(first, tuple({n: tuple(a.shape) for n, a in f.items()} for f in feeds_list), errors,
                        runs=config.runs)


async def warm_request_path(scheduler: Any, specs: Sequence[TensorSpec], report: WarmupReport) -> None:
    """One seeded request per warmed plan through ``scheduler`` (its queue, batcher and device worker);
    for a ``deferred`` report, arrange the whole warm-up at the first request's shapes instead.

    ``warm_up`` runs the plans on the loader's thread; a served request runs them on the
    device workers' threads, which start on first use, and ONNX Runtime's first run on a new
    calling thread pays again (measured on a 64 px MobileNet-style model: the first request's
    queue + compute 0.9 ms after ``warm_up`` alone, 0.37 ms for the tenth). This pays both before
    the model reports ready. A failure here is logged, never fatal: ``warm_up`` already ran the plan.
    """
    if report.deferred:
        plans = [name for name, plan in scheduler.plans.items() if "cloud" not in getattr(plan, "backends", ())]

        async def deferred(shapes: ShapeSet) -> None:
            await warm_at(scheduler, specs, shapes, plans, report.runs)

        scheduler.defer_until_shapes(deferred)
        return
    if not report.done or not report.shapes:
        return
    feeds = sample_feeds(specs, report.shapes[0])
    for name in report.first_run_ms:
        if name not in scheduler.plans:
            continue
        try:
            await scheduler.infer(feeds, plan=name)
        except Exception as exc:  # noqa: BLE001 - see the docstring: warming never fails a load
            log.warning("warm-up: plan %s through the scheduler failed (%s: %s)", name, type(exc).__name__, exc)


async def warm_at(scheduler: Any, specs: Sequence[TensorSpec], shapes: ShapeSet, plans: Sequence[str],
                  runs: int) -> dict[str, float]:
    """Deferred warm-up: ``runs`` seeded requests per plan at a real request's ``shapes``, queued behind
    real requests (``DEFERRED_PRIORITY``). Returns each plan's first run's compute ms; a plan that
    fails is a DEBUG line (the real request already told whether the shapes fit)."""
    from edge_runtime.scheduler.shape_jobs import DEFERRED_PRIORITY

    feeds = sample_feeds(specs, shapes)
    first: dict[str, float] = {}
    for name in plans:
        try:
            for run in range(runs):
                result = await scheduler.infer(feeds, plan=name, priority=DEFERRED_PRIORITY)
                first.setdefault(name, round(result.compute_ms, 3))
        except Exception as exc:  # noqa: BLE001 - warming never fails a request
            log.debug("warm-up: plan %s at %s failed (%s: %s)", name, dict(shapes), type(exc).__name__, exc)
    log.info("warm-up at the first request's shapes %s: first runs %s ms", dict(shapes), first)
    return first
