"""Build a ``ModelScheduler`` (plans, policy, shared device workers) for a loaded ``Model``.

Plans offered for a model:

* the model's own plan, named after its backend (``"cpu"``, ``"opencl"``, ``"tflite"``);
* unless the policy is ``fixed`` on that very plan: ``"cpu"`` (ONNX Runtime)
  when the model runs elsewhere, and ``"gpu"``: the whole model on the first
  GPU backend of the device profile's order that is available and takes every
  node (skipped, with a log line saying why, when none can);
* unless fixed: ``"hybrid"``, the partitioner's pipeline cut over the accelerator
  and the host, where it finds one with stages on both (a multi-stage
  ``PlanExecutor``: a stage that fails re-runs on the host, reported in the
  result's ``fallback``);
* under the default ``fixed`` policy on ``auto``, for a model ``auto`` placed by its measured
  race: the candidates measured close to the winner, and ``cpu`` (``recheck.candidate_plans``),
  which ``recheck.PlanRecheck`` compares with the served plan from live latencies;
* ``extra_plans`` from the caller (a cloud plan; a ``"hybrid"`` there replaces ours).

Where ``auto`` chose the model's plan by measurement (its load report's
``decision``, ``edge_runtime.plan_race``), only the candidates measured within
its margin of the winner are compiled as extra plans: a plan measured far
slower would never be chosen, and compiling it costs memory and, for a GPU
plan, maps the GPU driver (PoCL, LLVM, libclang: ~100 MiB resident) into a
daemon whose models all run on the CPU.

CPU plans are compiled with the intra-op threads of ``workers.cpu_split``, so
the cpu worker's concurrent runs never oversubscribe the cores, and with the
model's spin policy (``[scheduler] spin``, ``spin.py``: under ``load``, a small model
served with a load monitor also gets a non-spinning twin session for the times
other processes hold the cores), and a small model on 2+ threads a switch to a one-thread
session for the input shapes it runs cheaper (``single_thread.py``). Models of one
``Runtime`` share one set of device workers.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from pathlib import Path
from typing import Any, Mapping

from backends.base import CompileOptions
from edge_runtime.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigError,
    InvalidInputError,
    ModelLoadError,
)
from edge_runtime.load_monitor import LoadConfig, LoadMonitor
from edge_runtime.scheduler.batch_probe import BatchingDecision, decide_batching, probe_served
from edge_runtime.scheduler.config import ModelConfig
from edge_runtime.scheduler.plans import GPU_BACKENDS, Plan, model_plan
from edge_runtime.scheduler.recheck import candidate_plans, plan_recheck
from edge_runtime.scheduler.scheduler import ModelScheduler
from edge_runtime.scheduler.shape_jobs import DEFERRED_PRIORITY
from edge_runtime.scheduler.single_thread import SingleThreadSwitch
from edge_runtime.scheduler.spin import TWIN_MAX_BYTES, SpinSwitch, spin_settings
from edge_runtime.scheduler.workers import DeviceWorkers

log = logging.getLogger(__name__)

_WORKERS: "weakref.WeakKeyDictionary[Any, DeviceWorkers]" = weakref.WeakKeyDictionary()


def runtime_workers(runtime: Any) -> DeviceWorkers:
    """The device workers every model of ``runtime`` shares (created on first use)."""
    if runtime not in _WORKERS:
        _WORKERS[runtime] = DeviceWorkers(cpu_cores=runtime.threads)
    return _WORKERS[runtime]


def monitor_for(runtime: Any, config: LoadConfig | None = None) -> LoadMonitor:
    """A LoadMonitor on the runtime's probe root and the GPU busy source its probe found (not started)."""
    source = (runtime.profile.get("load_sources") or {}).get("gpu_busy") or {}
    return LoadMonitor(config, root=runtime.config.probe_root, gpu_source=source)


def scheduler_for(model: Any, config: ModelConfig, runtime: Any, monitor: LoadMonitor | None = None, *,
                  workers: DeviceWorkers | None = None,
                  extra_plans: Mapping[str, Plan] | None = None) -> ModelScheduler:
    """A scheduler for ``model`` with every plan its policy can use (see the module docstring).

    Raises ConfigError when a ``fixed`` policy names a plan the model does not have.
    """
    workers = workers or runtime_workers(runtime)
    threads = workers.cpu.intra_op_threads
    plans: dict[str, Plan] = {}
    owned: list[Any] = []
    own = model
    compiled = model.options
    spin = spin_settings(config.scheduler.spin, config.scheduler.spin_wait_us)
    if model.backend == "cpu" and (compiled is None or compiled.intra_op_threads != threads
                                   or not spin.matches(compiled)):
        # Re-split the cores for concurrent runs; spin by the model's spin policy (spin.py).
        own = _load(runtime, model, "cpu", threads, config)
        owned.append(own)
    plans[model.backend] = model_plan(model.backend, own)
    switch = _spin_switch(runtime, model, own, config, threads, monitor)
    if switch is not None:
        owned.append(switch.quiet_model)
        plans[model.backend] = dataclasses.replace(plans[model.backend], call=switch)
    single = _single_thread_switch(runtime, model, plans[model.backend].call, config, threads)
    if single is not None:
        owned.append(single)
        plans[model.backend] = dataclasses.replace(plans[model.backend], call=single)
    wanted = config.scheduler.plan
    needs_more = config.scheduler.policy != "fixed" or wanted not in ("auto", model.backend)
    if config.scheduler.policy == "fixed" and wanted == "auto":  # auto-core: auto's candidates, re-checked live
        candidates, compiled = candidate_plans(runtime, model, _serving(runtime, threads, config))
        plans.update(candidates)
        owned.extend(compiled)
    if needs_more and _is_onnx(model):
        worth = _worth_keeping(model)
        if "cpu" not in plans and "cpu" in worth and runtime.availability("cpu").ok:
            cpu = _load(runtime, model, "cpu", threads, config)
            owned.append(cpu)
            plans["cpu"] = model_plan("cpu", cpu)
        if not any(name in GPU_BACKENDS for name in plans) and "gpu" in worth:
            gpu = _first_gpu_model(runtime, model, threads, config)
            if gpu is not None:
                owned.append(gpu)
                plans["gpu"] = model_plan("gpu", gpu)
        if "hybrid" not in (extra_plans or {}) and "hybrid" in worth:
            hybrid = _hybrid_plan(runtime, model, threads, config)
            if hybrid is not None:
                owned.append(hybrid)
                plans["hybrid"] = hybrid
    plans.update(extra_plans or {})
    batching = _batching(model, config, plans[model.backend])
    try:
        scheduler = ModelScheduler(model.name, model.inputs, plans, config, outputs=model.outputs, monitor=monitor,
                                   workers=workers, default_plan=model.backend, owned=owned, batching=batching,
                                   recheck=plan_recheck(model.name, config, plans, model.backend),
                                   spin_switch=switch, single_thread=single)
    except ConfigError:
        for extra in owned:
            extra.close()
        raise
    if batching.deferred:
        _defer_batching(scheduler, model, config, model.backend)
    return scheduler


def _spin_switch(runtime: Any, model: Any, own: Any, config: ModelConfig, threads: int,
                 monitor: LoadMonitor | None) -> SpinSwitch | None:
    """The ``load`` spin policy's quiet twin of the model's own cpu session and the switch between
    them (``spin.py``), where there is a monitor to read the host's load and the model is small."""
    if model.backend != "cpu" or config.scheduler.spin != "load" or monitor is None or not _is_onnx(model):
        return None
    if not _small(model):
        log.info("model %s: no quiet twin session (larger than %d MiB): it spins within runs whatever the load",
                 model.name, TWIN_MAX_BYTES >> 20)
        return None
    quiet = runtime.load(model.path, name=model.name, backend="cpu",
                         options=spin_settings("never").apply(_serving(runtime, threads, config)))
    switch = SpinSwitch(own._run_validated, quiet._run_validated, lambda: monitor.reading)
    switch.quiet_model = quiet
    return switch


def _single_thread_switch(runtime: Any, model: Any, pool: Any, config: ModelConfig,
                          threads: int) -> SingleThreadSwitch | None:
    """The switch that serves each input shape of a small cpu model by its pool session or a
    one-thread session, whichever is measured cheaper (``single_thread.py``; the one-thread
    session is built when a shape's runs prove short)."""
    if (model.backend != "cpu" or threads < 2 or config.scheduler.single_thread != "auto"
            or not _is_onnx(model) or not _small(model)):
        return None
    options = dataclasses.replace(spin_settings("never").apply(_serving(runtime, threads, config)), intra_op_threads=1)
    return SingleThreadSwitch(pool, build=lambda: runtime.load(model.path, name=model.name, backend="cpu",
                                                               options=options), pool_threads=threads)


def _small(model: Any) -> bool:
    """Whether a second session of ``model`` is cheap enough to keep (its file at most ``TWIN_MAX_BYTES``)."""
    try:
        return Path(model.path).stat().st_size <= TWIN_MAX_BYTES
    except OSError:
        return False


def _worth_keeping(model: Any) -> frozenset[str]:
    """The extra plan kinds worth compiling for ``model``: all of them without a measured decision;
    with one, the winner and the candidates measured within its margin (see the module docstring)."""
    decision = getattr(getattr(model, "report", None), "decision", None)
    if decision is None:
        return frozenset(("cpu", "gpu", "hybrid"))
    close = {entry.name for entry in decision.close_candidates()}
    kept = frozenset(n for n in ("cpu", "gpu", "hybrid") if n in close or n == decision.winner)
    dropped = sorted({"cpu", "gpu", "hybrid"} - kept - {model.backend})
    if dropped:
        log.info("model %s: plans %s not compiled: measured slower than %s by more than the margin (%s)",
                 model.name, dropped, decision.winner, decision.reason)
    return kept


def _batching(model: Any, config: ModelConfig, plan: Plan) -> BatchingDecision:
    """The load-time batching experiment on the model's own plan at its served shapes; a refusal of
    configured batching warns; without served shapes the experiment waits for the first request."""
    from edge_runtime.warmup import warmup_config

    shapes = warmup_config(config.extra.get("warmup"), config.source).shapes
    decision = decide_batching(config.batching, model.inputs, model.outputs, plan.run, shapes)
    if decision.deferred:
        log.info("model %s: %s", model.name, decision.reason)
    elif config.batching.enabled and not decision.enabled:
        log.warning("model %s: [batching] max_batch_size = %d configured, but batching is off: %s",
                    model.name, config.batching.max_batch_size, decision.reason)
    elif decision.enabled:
        log.info("model %s: batching up to %d rows (%s)", model.name, decision.max_batch_size, decision.reason)
    return decision


def _defer_batching(scheduler: ModelScheduler, model: Any, config: ModelConfig, plan: str) -> None:
    """Run the batching experiment at the first request's shapes, through the scheduler's own queue."""

    async def probe(shapes: Mapping[str, tuple[int, ...]]) -> None:
        async def run(feeds: Mapping[str, Any]) -> Mapping[str, Any]:
            return (await scheduler.infer(feeds, plan=plan, priority=DEFERRED_PRIORITY)).outputs

        decision = await probe_served(config.batching, model.inputs, shapes, run)
        scheduler.set_batching(decision)
        if decision.enabled:
            log.info("model %s: batching up to %d rows (%s)", model.name, decision.max_batch_size, decision.reason)
        else:
            log.warning("model %s: [batching] max_batch_size = %d configured, but batching is off: %s",
                        model.name, config.batching.max_batch_size, decision.reason)

    scheduler.defer_until_shapes(probe)


def _is_onnx(model: Any) -> bool:
    return str(model.path).lower().endswith(".onnx")


def serving_options(runtime: Any, config: ModelConfig | None = None) -> CompileOptions:
    """Compile options for served models: the cpu worker's intra-op threads, and the spin policy of
    ``config`` (default ``load``: pool threads spin only while a run is in flight, ``spin.py``).

    NOTE: ONNX Runtime's pool threads spin between runs by default, burning a core of a
    small device that the event loop and other models need; a served session's threads
    stop spinning when its last run returns.
    """
    threads = runtime_workers(runtime).cpu.intra_op_threads
    spin = spin_settings(config.scheduler.spin, config.scheduler.spin_wait_us) if config is not None \
        else spin_settings("load")
    return spin.apply(dataclasses.replace(runtime.compile_options(), intra_op_threads=threads))


def _serving(runtime: Any, threads: int, config: ModelConfig | None) -> CompileOptions:
    return dataclasses.replace(serving_options(runtime, config), intra_op_threads=threads)


def _load(runtime: Any, model: Any, backend: str, threads: int, config: ModelConfig | None) -> Any:
    return runtime.load(model.path, name=model.name, backend=backend, options=_serving(runtime, threads, config))


def _hybrid_plan(runtime: Any, model: Any, threads: int, config: ModelConfig | None) -> Any | None:
    """The partitioner's ``hybrid`` plan (accelerator and host stages), or None (logged) where it
    keeps the whole model on one backend or no accelerator is usable."""
    if runtime.accelerator() is None:
        return None
    try:
        planner = runtime.planner(model.path)
        layout = planner.layout("hybrid")
        if len({stage.backend for stage in layout.partition.stages}) < 2:
            log.info("model %s: no hybrid plan: the partitioner keeps every node on one backend", model.name)
            return None
        return planner.compile(layout, _serving(runtime, threads, config))
    except (BackendUnavailableError, BackendError, ModelLoadError, InvalidInputError) as exc:
        log.info("model %s: no hybrid plan: %s", model.name, exc)
        return None


def _first_gpu_model(runtime: Any, model: Any, threads: int, config: ModelConfig | None) -> Any | None:
    for backend in runtime.backend_order():
        if backend not in GPU_BACKENDS:
            continue
        availability = runtime.availability(backend)
        if not availability.ok:
            log.info("model %s: no %s plan: %s", model.name, backend, availability.reason)
            continue
        try:
            return _load(runtime, model, backend, threads, config)
        except (BackendUnavailableError, BackendError, ModelLoadError, InvalidInputError) as exc:
            log.info("model %s: no %s plan: %s", model.name, backend, exc)
    return None
