"""``GET /metrics``: Prometheus text from a registry private to one app.

Triton's metric names are used where the meaning matches, with labels ``model``
and ``version``. NOTE: prometheus-client renames any family typed ``counter``
to ``<name>_total``; Triton's names have no suffix, so those families are
exposed untyped under their exact names (Prometheus stores and ``rate()``s
them the same). Our own counters are typed counters (``edge_runtime_plan_total``).

| metric | meaning |
|---|---|
| nv_inference_request_success / _failure{reason} | requests answered / failed (REJECTED, TIMEOUT, INVALID, BACKEND, CANCELED, OTHER) |
| nv_inference_count / nv_inference_exec_count | inferences (batch rows) / model executions |
| nv_inference_pending_request_count | requests waiting in the model's queue now |
| edge_runtime_model_memory_bytes | resident memory each version's load added (``process_resident_memory_bytes``: the whole process) |
| nv_inference_queue_duration_us, nv_inference_compute_infer_duration_us, nv_inference_request_duration_us | cumulative µs |
| edge_runtime_plan_total{model,version,plan} | requests per plan the scheduler chose |
| edge_runtime_backend_fallback_total{model,backend,reason} | requests whose stage re-ran on cpu |
| edge_runtime_plan_abandoned_total{model,version,plan,reason} | served plans abandoned for a candidate measured faster live (``scheduler.recheck``) |
| edge_runtime_cloud_calls_total{model,outcome} | cloud calls: outcome ``ok`` or the failure kind (refused, timeout, breaker_open, ...) |
| edge_runtime_cloud_breaker_state{state} | 1 for the cloud circuit breaker's state (closed, open, half_open), 0 for the others |
| edge_runtime_cloud_breaker_opened_total, edge_runtime_cloud_breaker_rejected_total | times it opened; calls it refused |
| edge_runtime_cpu_utilization, edge_runtime_cpu_utilization_own | CPU busy share, all and ours (the LoadMonitor's reading) |
| edge_runtime_gpu_busy{source}, edge_runtime_gpu_busy_own | GPU busy share (driver counter or our own occupancy) |
| edge_runtime_memory_used_fraction, edge_runtime_memory_stall_fraction | memory in use; PSI share of time stalled on memory |
| edge_runtime_thermal_headroom_celsius, edge_runtime_thermal_throttled | lowest trip point minus temperature; 1 when reached |
| edge_runtime_load_pinned{reading} | 1 for each reading an operator pinned (``[load] pin_*``) |
| edge_runtime_memory_used_bytes, edge_runtime_memory_total_bytes, edge_runtime_load1 | device memory and load average (psutil) |
| edge_runtime_async_tasks{status} | async tasks kept now |
| edge_runtime_result_cache_*, edge_runtime_model_memory_bytes, edge_runtime_memory_budget_* | see ``residency_metrics`` |

The load gauges show the LoadMonitor's latest reading, the very numbers the
scheduling policies decide on; a reading the device cannot give is left out.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Iterable

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from edge_runtime.serving.repository import ModelRepository
    from edge_runtime.serving.stats import InferenceStats, VersionStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LABELS = ("model", "version")
BREAKER_STATES = ("closed", "open", "half_open")

# Triton name -> (help, value of a version's stats)
_TRITON_COUNTERS: dict[str, tuple[str, Callable[["VersionStats"], float]]] = {
    "nv_inference_request_success": ("Number of successful inference requests", lambda s: s.success.count),
    "nv_inference_count": ("Number of inferences performed (batch rows)", lambda s: s.inference_count),
    "nv_inference_exec_count": ("Number of model executions performed", lambda s: s.execution_count),
    "nv_inference_request_duration_us": ("Cumulative inference request duration in microseconds",
                                         lambda s: s.request_ns / 1e3),
    "nv_inference_queue_duration_us": ("Cumulative inference queuing duration in microseconds",
                                       lambda s: s.queue.ns / 1e3),
    "nv_inference_compute_infer_duration_us": ("Cumulative compute inference duration in microseconds",
                                               lambda s: s.compute_infer.ns / 1e3),
}


class ServerCollector:
    """Reads the server's live state at scrape time; holds no copies of it."""

    def __init__(self, stats: "InferenceStats", repository: "ModelRepository",
                 task_counts: Callable[[], dict[str, int]]) -> None:
        import psutil

        self._stats = stats
        self._repository = repository
        self._task_counts = task_counts
        self._psutil = psutil

    def collect(self) -> Iterable[Metric]:
        yield from self._triton()
        yield from self._ours()
        yield from self._cloud()
        yield from self._load()
        yield from self._device()
        from edge_runtime.server.residency_metrics import residency_metrics

        yield from residency_metrics(self._repository)  # result cache, memory budget

    def _items(self) -> list[tuple[tuple[str, str], "VersionStats"]]:
        for served in self._repository.served():  # served versions show zeros before their first request
            self._stats.of(served.name, str(served.version))
        return self._stats.items()

    def _triton(self) -> Iterable[Metric]:
        items = self._items()
        for name, (doc, value_of) in _TRITON_COUNTERS.items():
            family = Metric(name, doc, "unknown")
            for (model, version), stats in items:
                family.add_sample(name, {"model": model, "version": version}, value_of(stats))
            yield family
        failure = Metric("nv_inference_request_failure", "Number of failed inference requests", "unknown")
        for (model, version), stats in items:
            for reason, count in sorted(stats.failures.items()):
                failure.add_sample("nv_inference_request_failure",
                                   {"model": model, "version": version, "reason": reason}, count)
        yield failure
        pending = GaugeMetricFamily("nv_inference_pending_request_count",
                                    "Instantaneous number of pending requests awaiting execution", labels=LABELS)
        memory = GaugeMetricFamily("edge_runtime_model_memory_bytes",
                                   "Resident memory the model version's load added", labels=LABELS)
        for served in self._repository.served():
            pending.add_metric([served.name, str(served.version)], served.dispatcher.pending)
            memory.add_metric([served.name, str(served.version)], served.memory_bytes)
        yield pending
        yield memory

    def _ours(self) -> Iterable[Metric]:
        items = self._items()
        plans = CounterMetricFamily("edge_runtime_plan", "Requests per plan the scheduler chose",
                                    labels=("model", "version", "plan"))
        fallbacks = CounterMetricFamily("edge_runtime_backend_fallback",
                                        "Requests whose backend stage failed and re-ran on cpu",
                                        labels=("model", "backend", "reason"))
        fallback_totals: dict[tuple[str, str, str], int] = {}
        for (model, version), stats in items:
            for plan, count in sorted(stats.plans.items()):
                plans.add_metric([model, version, plan], count)
            for (backend, reason), count in stats.fallbacks.items():
                key = (model, backend, reason)
                fallback_totals[key] = fallback_totals.get(key, 0) + count
        for key, count in sorted(fallback_totals.items()):
            fallbacks.add_metric(list(key), count)
        abandoned = CounterMetricFamily("edge_runtime_plan_abandoned",
                                        "Times a served plan was abandoned for a candidate measured faster live",
                                        labels=("model", "version", "plan", "reason"))
        for served in self._repository.served():
            scheduler = served.scheduler
            for (plan, reason), count in sorted(scheduler.abandoned().items() if scheduler is not None else ()):
                abandoned.add_metric([served.name, str(served.version), plan, reason], count)
        tasks = GaugeMetricFamily("edge_runtime_async_tasks", "Async tasks kept, by status", labels=("status",))
        for status, count in sorted(self._task_counts().items()):
            tasks.add_metric([status], count)
        yield from (plans, fallbacks, abandoned, tasks)

    def _cloud(self) -> Iterable[Metric]:
        services = self._repository.services
        calls = CounterMetricFamily("edge_runtime_cloud_calls", "Cloud calls by outcome (ok or the failure kind)",
                                    labels=("model", "outcome"))
        for (model, outcome), count in services.cloud_calls.items() if services is not None else ():
            calls.add_metric([model, outcome], count)
        yield calls
        if services is None or services.cloud is None:
            return
        breaker = services.cloud.breaker.snapshot()
        state = GaugeMetricFamily("edge_runtime_cloud_breaker_state", "1 for the cloud circuit breaker's state",
                                  labels=("state",))
        for name in BREAKER_STATES:
            state.add_metric([name], 1.0 if breaker.state == name else 0.0)
        yield state
        yield CounterMetricFamily("edge_runtime_cloud_breaker_opened", "Times the cloud circuit breaker opened",
                                  value=breaker.opened)
        yield CounterMetricFamily("edge_runtime_cloud_breaker_rejected",
                                  "Cloud calls the open circuit breaker refused", value=breaker.rejected)

    def _load(self) -> Iterable[Metric]:
        services = self._repository.services
        if services is None:
            return
        reading = services.monitor.reading
        gauges = (("edge_runtime_cpu_utilization", "CPU busy share of the device, 0..1", reading.cpu_busy),
                  ("edge_runtime_cpu_utilization_own", "This process's share of the CPU, 0..1", reading.cpu_busy_own),
                  ("edge_runtime_gpu_busy_own", "GPU busy share from this process's own runs, 0..1",
                   reading.gpu_busy_own),
                  ("edge_runtime_memory_used_fraction", "Device memory in use, 0..1", reading.mem_used_fraction),
                  ("edge_runtime_memory_stall_fraction", "Share of time tasks stalled on memory (PSI some avg10)",
                   reading.mem_stall_fraction),
                  ("edge_runtime_thermal_headroom_celsius", "Lowest thermal trip point minus its zone's temperature",
                   reading.thermal_headroom_c))
        for name, doc, value in gauges:
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=value)
        if reading.gpu_busy is not None:
            gpu = GaugeMetricFamily("edge_runtime_gpu_busy", "GPU busy share, 0..1", labels=("source",))
            gpu.add_metric([reading.gpu_busy_source], reading.gpu_busy)
            yield gpu
        if reading.thermal_headroom_c is not None:
            yield GaugeMetricFamily("edge_runtime_thermal_throttled", "1 when a thermal zone reached its trip point",
                                    value=1.0 if reading.throttled else 0.0)
        pinned = GaugeMetricFamily("edge_runtime_load_pinned", "1 for each load reading pinned by configuration",
                                   labels=("reading",))
        for name in reading.pinned:
            pinned.add_metric([name], 1.0)
        yield pinned

    def _device(self) -> Iterable[Metric]:
        memory = self._psutil.virtual_memory()
        yield GaugeMetricFamily("edge_runtime_memory_used_bytes", "Device memory in use", value=memory.used)
        yield GaugeMetricFamily("edge_runtime_memory_total_bytes", "Device memory in total", value=memory.total)
        if hasattr(os, "getloadavg"):
            yield GaugeMetricFamily("edge_runtime_load1", "1-minute load average", value=os.getloadavg()[0])


def make_registry(collector: ServerCollector) -> CollectorRegistry:
    """A registry of this app's own: two apps in one process never share metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
    return registry


def scrape(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
