"""Graph planning: cost model, partitioner, stage extraction and plan execution.

    prepare + GraphView (graph)  ->  CostTable (cost, calibration)
    -> Partition of StageSpecs (partitioner)  ->  ONNX subgraphs (stages)
    -> PlanExecutor (executor; run_many pipelines stages, see pipeline)

``Planner`` (plans) ties them together and builds the named plans ``cpu``,
``gpu``, ``hybrid`` and ``auto``. Plain synchronous code over plain data;
``onnx`` is imported inside functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_runtime.planning.cost import BackendSpeed
    from edge_runtime.planning.executor import FallbackKey, PlanExecutor, PlanRun
    from edge_runtime.planning.plans import PLAN_NAMES, Planner, PlanLayout

_LAZY = {"BackendSpeed": "edge_runtime.planning.cost", "FallbackKey": "edge_runtime.planning.executor",
         "PlanExecutor": "edge_runtime.planning.executor", "PlanRun": "edge_runtime.planning.executor",
         "PLAN_NAMES": "edge_runtime.planning.plans", "Planner": "edge_runtime.planning.plans",
         "PlanLayout": "edge_runtime.planning.plans"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'edge_runtime.planning' has no attribute {name!r}")


__all__ = sorted(_LAZY)
