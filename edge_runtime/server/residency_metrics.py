"""Metrics of what a model holds: result-cache counters and memory-budget charges (read at scrape time).

| metric | meaning |
|---|---|
| edge_runtime_result_cache_hits / _misses / _evictions {model,version} | result-cache lookups that hit / missed; entries dropped for room or age |
| edge_runtime_result_cache_bytes {model,version} | bytes of outputs the cache holds now |
| edge_runtime_model_memory_charged_bytes {model} | a loaded model's charge against the budget (the measured RSS growth per version is ``edge_runtime_model_memory_bytes``, in ``metrics``) |
| edge_runtime_memory_budget_bytes, edge_runtime_memory_budget_used_bytes | the ``[memory]`` budget (0 = none) and the charges against it |
| edge_runtime_memory_budget_unloads | models unloaded to make room |
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from edge_runtime.serving.repository import ModelRepository

_LABELS = ("model", "version")


def residency_metrics(repository: "ModelRepository") -> Iterable[Metric]:
    counters = {name: CounterMetricFamily(f"edge_runtime_result_cache_{name}", doc, labels=_LABELS)
                for name, doc in (("hits", "Result-cache lookups that hit"),
                                  ("misses", "Result-cache lookups that missed"),
                                  ("evictions", "Result-cache entries dropped for room or age"))}
    held = GaugeMetricFamily("edge_runtime_result_cache_bytes", "Bytes of outputs the result cache holds",
                             labels=_LABELS)
    for served in repository.served():
        cache = served.extras.result_cache if served.extras is not None else None
        if cache is None:
            continue
        snapshot, labels = cache.snapshot(), [served.name, str(served.version)]
        for name, family in counters.items():
            family.add_metric(labels, snapshot[name])
        held.add_metric(labels, snapshot["bytes"])
    yield from (*counters.values(), held)
    budget = repository.budget.snapshot()
    memory = GaugeMetricFamily("edge_runtime_model_memory_charged_bytes",
                               "What a loaded model is charged against the memory budget", labels=("model",))
    for owner, charge in sorted(budget["owners"].items()):
        memory.add_metric([owner], charge["bytes"])
    yield memory
    yield GaugeMetricFamily("edge_runtime_memory_budget_bytes", "The daemon's memory budget (0 = none)",
                            value=budget["budget_bytes"])
    yield GaugeMetricFamily("edge_runtime_memory_budget_used_bytes", "Charges against the memory budget",
                            value=budget["used_bytes"])
    yield CounterMetricFamily("edge_runtime_memory_budget_unloads", "Models unloaded to make room",
                              value=budget["unloads"])
