"""Named plans of one model: ``cpu``, ``gpu``, ``hybrid`` and ``auto``.

* ``cpu``: the host backend alone (the whole model in one stage).
* ``gpu``: the accelerator takes every node it claims, the host the rest
  (and accelerator islands too small to pay for their copies).
* ``hybrid``: a two-sided cut balancing accelerator and host, for pipelined
  throughput (``PlanExecutor.run_many``).
* ``auto``: the lower estimated latency of ``gpu`` and the cost-driven
  partition over both backends, if ``AUTO_MIN_SPEEDUP`` times faster than
  ``cpu``; else ``cpu``.

Without a usable accelerator only ``cpu`` and ``auto`` (equal to ``cpu``) exist.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from backends.base import Backend, CompileOptions, Executable, backend_nodes_of, claimed_indices
from backends.errors import BackendError, BackendUnavailableError, ModelLoadError, UnsupportedNodesError
from backends.onnx_graph import graph_inputs, graph_outputs, node_label, tensor_specs
from edge_runtime.planning import partitioner
from edge_runtime.planning.cost import BackendSpeed, bound_input_shapes, bound_tensor_specs, node_cost, tensor_bytes
from edge_runtime.planning.executor import CompiledStage, PlanExecutor
from edge_runtime.planning.graph import GraphView, outer_scope_names, prepare
from edge_runtime.planning.layout import CostTable, Partition, StageSpec, layout, stage_spec
from edge_runtime.planning.qdq import qdq_units
from edge_runtime.planning.stages import StageExtractor

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

PLAN_NAMES = ("cpu", "gpu", "hybrid", "auto")
AUTO_MIN_SPEEDUP = 1.5
"""``auto`` leaves the host only for a plan estimated this many times faster."""


@dataclass(frozen=True)
class PlanLayout:
    """A named plan before compiling: its partition into stages."""

    name: str
    partition: Partition


class Planner:
    """Partitions one ONNX model over a host backend and at most one accelerator.

    ``speeds`` must hold every backend in ``backends``. ``input_shapes`` binds
    dynamic input dimensions for the cost estimates (see ``cost``); plans
    themselves still take any size the model takes.
    """

    def __init__(self, model: "onnx.ModelProto", backends: Mapping[str, Backend],
                 speeds: Mapping[str, BackendSpeed], *, host: str = "cpu", accelerator: str | None = None,
                 input_shapes: Mapping[str, Sequence[int]] | None = None) -> None:
        if host not in backends or (accelerator is not None and accelerator not in backends):
            raise ValueError(f"backends {sorted(backends)} must include host {host!r} and accelerator {accelerator!r}")
        self.model = model
        self.host = host
        self.accelerator = accelerator
        self.backends = {name: backends[name] for name in (host, accelerator) if name is not None}
        self.prepared = prepare(model)
        self.view = GraphView(self.prepared.model)
        self.speeds = {name: speeds[name] for name in self.backends}
        self.claims = _claims(self.prepared.model, self.backends)
        units = qdq_units(self.prepared.model)  # integer kernels on the host only (see planning.qdq)
        if units and accelerator is not None:
            self.claims[accelerator] = self.claims[accelerator] - units
        self.table = self._table(input_shapes)
        self._extractor: StageExtractor | None = None
        self._first_reader: dict[str, int] = {}
        for index, node in enumerate(self.prepared.model.graph.node):
            for name in (*node.input, *outer_scope_names(node)):
                if name in self.prepared.lifted:
                    self._first_reader.setdefault(name, index)
        for name in self.prepared.lifted:
            self._first_reader.setdefault(name, 0)  # unread constants: the first stage compiled them

    def available(self) -> tuple[str, ...]:
        return PLAN_NAMES if self.accelerator is not None else ("cpu", "auto")

    def layout(self, name: str) -> PlanLayout:
        """The partition of plan ``name``; BackendUnavailableError if this device has no such plan."""
        host, acc, view, table = self.host, self.accelerator, self.view, self.table
        if name not in PLAN_NAMES:
            raise BackendUnavailableError(f"unknown plan {name!r}; plans: {list(PLAN_NAMES)}")
        if name == "cpu" or (name == "auto" and acc is None):
            partitioner.check_claimed(view, table, (host,))
            return PlanLayout(name, layout(view, table, [host] * len(view)))
        if acc is None:
            raise BackendUnavailableError(f"plan {name!r} needs an accelerator backend; none is usable here")
        if name == "gpu":
            return PlanLayout(name, partitioner.offload(view, table, acc, host))
        if name == "hybrid":
            return PlanLayout(name, partitioner.pipeline(view, table, acc, host))
        best = min(partitioner.fastest(view, table, (acc, host)), partitioner.offload(view, table, acc, host),
                   key=lambda p: p.latency_s)
        if all(n.index in table.claims[host] for n in view.nodes):
            host_only = layout(view, table, [host] * len(view))
            # NOTE: estimates carry calibration noise, and each stage moved off the host costs kernel
            # builds and risk: leave the host only for a clear gain.
            if best.latency_s * AUTO_MIN_SPEEDUP > host_only.latency_s:
                best = host_only
        return PlanLayout(name, best)

    def estimate_ms(self, plan: PlanLayout, input_shapes: Mapping[str, Sequence[int]]) -> float:
        """Estimated latency of ``plan``'s stages at other input sizes (say, a batch the batcher forms)."""
        table = self._table(input_shapes)
        return sum(stage_spec(self.view, table, s.backend, s.nodes).est_s for s in plan.partition.stages) * 1e3

    def unclaimed_ops(self) -> dict[str, int]:
        """Op type -> count of the nodes the accelerator does not claim (they run on the host); {} without one."""
        if self.accelerator is None:
            return {}
        claimed = self.claims[self.accelerator]
        counts: dict[str, int] = {}
        for index, node in enumerate(self.prepared.model.graph.node):
            if index not in claimed:
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    def describe(self, plan: PlanLayout) -> dict[str, Any]:
        part = plan.partition
        return {"name": plan.name, "backends": list(part.backends), "est_ms": round(part.latency_s * 1e3, 4),
                "bottleneck_ms": round(part.bottleneck_s * 1e3, 4),
                "host_only_ops": self.unclaimed_ops() if plan.name != "cpu" else {},
                "stages": [{**s.to_dict(self.view, self.table),
                            "node_count": len(s.nodes) + self._lifted_owned(s)} for s in part.stages]}

    def compile(self, plan: PlanLayout, options: CompileOptions) -> PlanExecutor:
        """Compile every stage on its backend; a stage the accelerator cannot compile goes to the host."""
        stages = plan.partition.stages
        compiled = []
        for k, stage in enumerate(stages):
            if len(stages) == 1:
                compiled.append(self._whole_model(stage, options))
            else:
                compiled.append(self._stage(plan.name, k, stage, options))
        host = self.backends[self.host]
        return PlanExecutor(plan.name, compiled, graph_inputs(self.model), graph_outputs(self.model),
                            host=self.host, compile_fallback=lambda sub: host.compile(sub, options),
                            estimated_ms=round(plan.partition.latency_s * 1e3, 4))

    def _table(self, input_shapes: Mapping[str, Sequence[int]] | None) -> CostTable:
        model = self.prepared.model
        bound = bound_tensor_specs(model, bound_input_shapes(graph_inputs(model), input_shapes),
                                   probe=self.backends[self.host])
        costs = [node_cost(node, bound) for node in model.graph.node]
        return CostTable(node_s={name: tuple(speed.node_s(c) for c in costs) for name, speed in self.speeds.items()},
                         claims=self.claims, tensor_bytes={name: tensor_bytes(spec) or 0 for name, spec in bound.items()},
                         speeds=self.speeds)

    def _whole_model(self, stage: StageSpec, options: CompileOptions) -> CompiledStage:
        executable = self.backends[stage.backend].compile(self.model, options)
        counts = backend_nodes_of(executable, stage.backend, self.prepared.original_node_count)
        return CompiledStage(stage, executable, self.model, counts)

    def _stage(self, plan: str, k: int, stage: StageSpec, options: CompileOptions) -> CompiledStage:
        if self._extractor is None:
            self._extractor = StageExtractor(self.prepared.model, self.view)
        sub = self._extractor.extract(stage, f"{self.model.graph.name or 'model'}:{plan}:stage{k}:{stage.backend}")
        note = None
        try:
            executable: Executable = self.backends[stage.backend].compile(sub, options)
        except Exception as exc:  # any accelerator compile failure: this stage runs on the host
            if stage.backend == self.host:
                raise
            contracted = isinstance(exc, (BackendError, BackendUnavailableError, ModelLoadError))
            # A backend declining nodes of the extracted stage (a node it claimed in the whole graph, e.g.
            # one that folds only with an input this stage does not have) is the designed fallback, kept
            # in the stage's note: INFO. Any other compile failure is a fault worth a WARNING.
            level = logging.INFO if isinstance(exc, UnsupportedNodesError) else logging.WARNING
            log.log(level, "plan %s: stage %d does not compile on %s (%s: %s); it runs on %s", plan, k,
                    stage.backend, type(exc).__name__, exc, self.host, exc_info=not contracted)
            note = f"{stage.backend}: {type(exc).__name__}: {exc}"
            stage = _on(stage, self.host)
            executable = self.backends[self.host].compile(sub, options)
        counts = backend_nodes_of(executable, stage.backend, len(sub.graph.node))
        # Lifted Constants and nodes dropped as dead count under the stage that compiled them.
        extra = len(stage.nodes) - len(sub.graph.node) + self._lifted_owned(stage)
        counts[stage.backend] = counts.get(stage.backend, 0) + extra
        return CompiledStage(stage, executable, sub, counts, compile_note=note)

    def _lifted_owned(self, stage: StageSpec) -> int:
        """How many lifted Constants count under ``stage``: those whose first reader it holds."""
        members = set(stage.nodes)
        return sum(1 for reader in self._first_reader.values() if reader in members)


def _on(stage: StageSpec, backend: str) -> StageSpec:
    from dataclasses import replace

    return replace(stage, backend=backend, copy_bytes=0, copy_s=0.0, exchange_s=0.0)


def _claims(model: "onnx.ModelProto", backends: Mapping[str, Backend]) -> dict[str, frozenset[int]]:
    """Indices of the nodes each backend claims, asked with the model's symbolic shapes.

    A backend with the optional whole-graph hook ``unclaimed_nodes(model)`` (OpenCL)
    is asked that too: a node it claims alone may still be refused in context — a
    ``Cast`` of an int32 ``ConvInteger`` result is shape arithmetic to ``supports``
    but runtime integer data to the graph — and such a stage would fail to compile.
    """
    specs = tensor_specs(model)
    claims = {}
    for name, backend in backends.items():
        refused = _refused_in_context(backend, model)
        claims[name] = frozenset(i for i in _claimed(backend, model, specs)
                                 if node_label(model.graph.node[i], i) not in refused)
    return claims


def _claimed(backend: Backend, model: "onnx.ModelProto", specs: Mapping[str, Any]) -> frozenset[int]:
    if callable(getattr(backend, "claims", None)):
        try:
            return claimed_indices(backend, model, specs)
        except Exception as exc:  # a backend's capability check must not break planning
            log.warning("backend %s: claims() raised %s; asking node by node", backend.name, exc)
    return frozenset(i for i, node in enumerate(model.graph.node) if _supports(backend, node, specs))


def _refused_in_context(backend: Backend, model: "onnx.ModelProto") -> frozenset[str]:
    hook = getattr(backend, "unclaimed_nodes", None)
    if not callable(hook):
        return frozenset()
    try:
        return frozenset(hook(model))
    except Exception as exc:  # a backend's capability check must not break planning
        log.warning("backend %s: unclaimed_nodes raised %s; using per-node claims only", backend.name, exc)
        return frozenset()


def _supports(backend: Backend, node: "onnx.NodeProto", specs: Mapping[str, Any]) -> bool:
    try:
        return bool(backend.supports(node, specs))
    except Exception as exc:  # a backend's capability check must not break planning
        log.warning("backend %s: supports(%s) raised %s; treating it as unsupported", backend.name,
                    node.name or node.op_type, exc)
        return False
