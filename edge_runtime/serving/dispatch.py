"""How one served model version answers: its scheduler, and a cloud router where its ``[cloud]`` asks.

``build_dispatcher`` (blocking: it compiles plans and profiles the model for
its cloud plans; call it in a worker thread) joins three parts:

* ``scheduler_for``: the model's plans for its ``[scheduler]`` policy (cpu and
  gpu plans, the cloud plans as extra plans), with the server's LoadMonitor;
* ``cloud_plans``: built from the model's ``[cloud]`` section when its mode is
  not ``never`` and the server has a ``[cloud]`` url;
* ``CloudRouter``: for every mode but ``never`` (``fallback``, ``always``,
  ``split``), and for a model that cannot load locally (no local runner).

``Dispatcher.infer`` answers with the scheduler's ``InferenceResult`` in every
case (a cloud answer gets one too), plus where it ran.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from backends.base import TensorSpec
from edge_runtime.cloud.config import CloudModelConfig, model_cloud_config
from edge_runtime.errors import ConfigError
from edge_runtime.scheduler import InferenceResult, ModelConfig, ModelScheduler

if TYPE_CHECKING:
    from edge_runtime.cloud.fallback import CloudRouter, RoutedResult
    from edge_runtime.scheduler.plans import Plan
    from edge_runtime.serving.services import SharedServices

log = logging.getLogger(__name__)

EWMA_ALPHA = 0.2  # weight of the newest local latency in the router's local estimate


@dataclass(frozen=True)
class Answer:
    """A result and where it ran: ``local``, ``cloud`` or ``split`` (head here, tail in the cloud)."""

    result: InferenceResult
    ran_on: str
    route: str | None = None  # the router's reason, when a router decided
    fallback_labels: tuple[str, str] | None = None  # (failed backend, short reason) for metrics


@dataclass(frozen=True)
class RemoteModel:
    """Stands in for a ``Model`` that cannot load on this device: its signature, no executable."""

    name: str
    path: Path
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    why: str  # why it does not load locally
    backend: str = "cloud"

    @property
    def backend_nodes(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        return None


class Dispatcher:
    """Answers one version's requests (see the module docstring); ``close`` drains and frees its plans."""

    def __init__(self, name: str, scheduler: ModelScheduler | None, cloud: CloudModelConfig | None = None, *,
                 routed_plan: Any | None = None, breaker: Any | None = None, closables: tuple[Any, ...] = ()) -> None:
        """``routed_plan`` (a cloud plan) and ``breaker`` (the client's) make a router; else the scheduler answers."""
        if scheduler is None and routed_plan is None:
            raise ValueError("a dispatcher needs a scheduler or a cloud plan")
        self.name = name
        self.scheduler = scheduler
        self.cloud = cloud or CloudModelConfig()
        self._closables = closables
        self._local_ms: float | None = None  # EWMA of local latency (queue + compute), the router's estimate
        self.router: CloudRouter | None = None
        if routed_plan is not None:
            from edge_runtime.cloud.fallback import CloudRouter, FallbackPolicy

            self.router = CloudRouter(FallbackPolicy(self.cloud, breaker),
                                      local=scheduler.infer if scheduler is not None else None, cloud=routed_plan,
                                      local_estimate_ms=self.local_estimate_ms)

    @property
    def plans(self) -> list[str]:
        if self.scheduler is not None:
            return sorted(self.scheduler.plans)
        return [getattr(self.router.cloud, "name", "cloud")] if self.router is not None else []

    @property
    def pending(self) -> int:
        return self.scheduler.pending if self.scheduler is not None else 0

    async def start(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.start()

    async def close(self, drain_timeout_s: float) -> None:
        """Drain the scheduler's queue (at most ``drain_timeout_s``), then free every plan."""
        if self.scheduler is not None:
            await self.scheduler.close(drain_timeout_s)
        self.discard()

    def discard(self) -> None:
        """Free the plans without draining: for a dispatcher that never served (``close`` calls it too)."""
        if self.scheduler is not None:
            self.scheduler.discard()
        for resource in self._closables:
            resource.close()
        self._closables = ()

    def local_estimate_ms(self) -> float | None:
        """Expected local latency now: the learned latency, longer by the requests already waiting."""
        if self._local_ms is None or self.scheduler is None:
            return None
        return self._local_ms * (1 + self.scheduler.pending)

    async def infer(self, feeds: Mapping[str, np.ndarray], *, priority: int = 0, timeout_ms: float | None = None,
                    request_id: str | None = None, validated: bool = False) -> Answer:
        """Run one request; raises what the scheduler or, where nothing local could answer, the cloud raises.

        ``validated``: the caller checked ``feeds`` against the model's inputs (the data plane does).
        """
        options = {"priority": priority, "timeout_ms": timeout_ms, "request_id": request_id, "validated": validated}
        if self.router is None:
            assert self.scheduler is not None
            result = await self.scheduler.infer(feeds, **options)
            return Answer(result, ran_on_of(result.backends), None, self._labels(result))
        started = time.perf_counter()
        routed = await self.router.infer(feeds, request_id=request_id,
                                         local_options=options if self.scheduler is not None else None)
        return self._answer(routed, (time.perf_counter() - started) * 1e3, request_id)

    def _answer(self, routed: "RoutedResult", elapsed_ms: float, request_id: str | None) -> Answer:
        local = routed.local_result
        if isinstance(local, InferenceResult):
            latency = local.queue_ms + local.compute_ms
            self._local_ms = latency if self._local_ms is None else self._local_ms + EWMA_ALPHA * (
                latency - self._local_ms)
            fallback = "; ".join(f for f in (routed.fallback, local.fallback) if f) or None
            result = dataclasses.replace(local, fallback=fallback, retried=routed.retried or local.retried,
                                         ran_twice=routed.ran_twice or local.ran_twice)
            return Answer(result, ran_on_of(result.backends), routed.reason, self._labels(local))
        backends = {"cloud": ("cloud",), "split": ("cpu", "cloud")}.get(routed.ran_on, ("cpu",))
        result = InferenceResult(routed.outputs, routed.plan, backends, 0.0, elapsed_ms, 1, request_id,
                                 routed.fallback, routed.retried, routed.ran_twice)
        return Answer(result, routed.ran_on, routed.reason)

    def _labels(self, result: InferenceResult) -> tuple[str, str] | None:
        """(backend that failed, short reason) of a result whose plan fell back, for bounded metric labels."""
        if result.fallback_labels is not None:  # a stage inside the plan re-ran on the host
            return result.fallback_labels
        if not result.fallback or self.scheduler is None:
            return None
        failed = next((plan for name, plan in self.scheduler.plans.items()
                       if f"'{name}'" in result.fallback and name != result.plan), None)
        backends = [b for b in (failed.backends if failed else ()) if b != "cpu"]
        # The scheduler says "plan 'gpu' failed: <error>"; keep the error's first clause, bounded.
        reason = result.fallback.split("failed:", 1)[-1].strip().split(":", 1)[0][:60] or "unknown"
        return (",".join(backends) or (failed.name if failed else result.plan)), reason


def ran_on_of(backends: tuple[str, ...]) -> str:
    """``cloud`` when only the cloud ran it, ``split`` when the cloud ran a part, else ``local``."""
    if "cloud" not in backends:
        return "local"
    return "cloud" if set(backends) == {"cloud"} else "split"


def build_dispatcher(name: str, path: Path, model: Any | None, config: ModelConfig, runtime: Any,
                     services: "SharedServices", extra_plans: Mapping[str, "Plan"] | None = None, *,
                     local_error: Exception | None = None) -> Dispatcher:
    """The dispatcher of one loaded version (``model``), or of one that failed to load (``local_error``).

    Blocking. Raises ``local_error`` when the model cannot load and no cloud
    can answer for it; ConfigError for a bad ``[cloud]`` or ``[scheduler]``.
    """
    from edge_runtime.scheduler.factory import scheduler_for

    where = config.source if config.source != "model config" else f"model {name!r} config"
    cloud = model_cloud_config(config.extra, where)
    client = services.cloud
    if cloud.mode != "never" and client is None:
        log.warning("model %s: [cloud] mode %r, but the server has no [cloud] url: serving it locally only",
                    name, cloud.mode)
    use_cloud = cloud.mode != "never" and client is not None
    if model is None:
        assert local_error is not None, "a version without a model comes with its load error"
        if not use_cloud or cloud.mode == "split":  # a split's head must run here
            raise local_error
        log.warning("model %s cannot load here (%s): its requests go to the cloud as %r",
                    name, local_error, cloud.remote_model)
    plans = _cloud_plans(name, path, cloud, runtime, services, local=model is not None) if use_cloud else {}
    closables = tuple(part for plan in plans.values() for part in (getattr(plan, "head", None),
                                                                   getattr(plan, "tail_local", None)) if part)
    scheduler = None
    if model is not None:
        try:
            scheduler = scheduler_for(model, config, runtime, services.monitor,
                                      extra_plans={**plans, **(extra_plans or {})})
        except BaseException:
            for part in closables:
                part.close()
            raise
    if not use_cloud:
        return Dispatcher(name, scheduler, cloud, closables=closables)
    # The router sends whole requests: "split" (the best cut now), else the one cut or the whole model.
    routed_plan = plans.get("split") or plans.get("cloud") or next(iter(plans.values()))
    return Dispatcher(name, scheduler, cloud, routed_plan=routed_plan, breaker=client.breaker, closables=closables)


def _cloud_plans(name: str, path: Path, cloud: CloudModelConfig, runtime: Any, services: "SharedServices", *,
                 local: bool) -> dict[str, Any]:
    """The cloud plans of ``cloud.mode``; a model that cannot run here (or is not ONNX) gets the plain
    ``cloud`` plan, unprofiled (its local time is unknown)."""
    from edge_runtime.cloud.factory import cloud_plans, runtime_compiler
    from edge_runtime.cloud.plans import CloudPlan

    client = services.cloud
    assert client is not None
    on_call = services.cloud_calls.hook(name)
    if local and path.suffix.lower() == ".onnx":
        from backends.onnx_graph import load_onnx
        from edge_runtime.scheduler.factory import runtime_workers

        threads = runtime_workers(runtime).cpu.intra_op_threads
        return cloud_plans(load_onnx(path), cloud, client, runtime_compiler(runtime), threads=threads,
                           on_call=on_call)
    if cloud.mode == "split":
        raise ConfigError(f"model {name!r}: [cloud] mode 'split' needs an ONNX model that loads here")
    return {"cloud": CloudPlan(client, cloud.remote_model, local_ms=0.0, io_bytes=0, on_call=on_call)}


def remote_model(name: str, path: Path, why: str) -> RemoteModel:
    """A RemoteModel with the signature read from the ONNX file; raises the loader's errors."""
    from backends.onnx_graph import graph_inputs, graph_outputs, load_onnx

    proto = load_onnx(path)
    return RemoteModel(name, path, graph_inputs(proto), graph_outputs(proto), why)
