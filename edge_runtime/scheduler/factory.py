"""Build a ``ModelScheduler`` (plans, policy, shared device workers) for a loaded ``Model``.

Plans offered for a model:

* the model's own plan, named after its backend (``"cpu"``, ``"opencl"``, ``"tflite"``);
* unless the policy is ``fixed`` on that very plan: ``"cpu"`` (ONNX Runtime)
  when the model runs elsewhere, and ``"gpu"``: the whole model on the first
  GPU backend of the device profile's order that is available and takes every
  node (skipped, with a log line saying why, when none can);
* ``extra_plans`` from the caller (the partitioner's ``"hybrid"``, a cloud plan).

CPU plans are compiled with the intra-op threads of ``workers.cpu_split``, so
the cpu worker's concurrent runs never oversubscribe the cores. Models of one
``Runtime`` share one set of device workers.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from typing import Any, Mapping

from edge_runtime.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigError,
    InvalidInputError,
    ModelLoadError,
)
from edge_runtime.load_monitor import LoadConfig, LoadMonitor
from edge_runtime.scheduler.config import ModelConfig
from edge_runtime.scheduler.plans import GPU_BACKENDS, CallablePlan, Plan
from edge_runtime.scheduler.scheduler import ModelScheduler
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
    if model.backend == "cpu" and threads != runtime.threads:
        own = _load(runtime, model, "cpu", threads)  # re-split the cores for concurrent cpu runs
        owned.append(own)
    plans[model.backend] = _plan(model.backend, own)
    wanted = config.scheduler.plan
    needs_more = config.scheduler.policy != "fixed" or wanted not in ("auto", model.backend)
    if needs_more and _is_onnx(model):
        if "cpu" not in plans and runtime.availability("cpu").ok:
            cpu = _load(runtime, model, "cpu", threads)
            owned.append(cpu)
            plans["cpu"] = _plan("cpu", cpu)
        if not any(name in GPU_BACKENDS for name in plans):
            gpu = _first_gpu_model(runtime, model, threads)
            if gpu is not None:
                owned.append(gpu)
                plans["gpu"] = _plan("gpu", gpu)
    plans.update(extra_plans or {})
    try:
        return ModelScheduler(model.name, model.inputs, plans, config, outputs=model.outputs, monitor=monitor,
                              workers=workers, default_plan=model.backend, owned=owned)
    except ConfigError:
        for extra in owned:
            extra.close()
        raise


def _plan(name: str, model: Any) -> CallablePlan:
    # The executable's own device wins (a .tflite model on a GPU delegate is a GPU plan); without
    # one, plan_device derives it from the backends' descriptors.
    device = getattr(model.executable, "device", "")
    return CallablePlan(name, tuple(model.backend_nodes), model._run_validated, device=device)


def _is_onnx(model: Any) -> bool:
    return str(model.path).lower().endswith(".onnx")


def _load(runtime: Any, model: Any, backend: str, threads: int) -> Any:
    options = dataclasses.replace(runtime.compile_options(), intra_op_threads=threads, allow_spinning=False)
    return runtime.load(model.path, name=model.name, backend=backend, options=options)


def _first_gpu_model(runtime: Any, model: Any, threads: int) -> Any | None:
    for backend in runtime.backend_order():
        if backend not in GPU_BACKENDS:
            continue
        availability = runtime.availability(backend)
        if not availability.ok:
            log.info("model %s: no %s plan: %s", model.name, backend, availability.reason)
            continue
        try:
            return _load(runtime, model, backend, threads)
        except (BackendUnavailableError, BackendError, ModelLoadError, InvalidInputError) as exc:
            log.info("model %s: no %s plan: %s", model.name, backend, exc)
    return None
