"""Stage layout: convex stages for a fixed node -> backend assignment, and their costs.

Stages are maximal runs of one backend along a topological order, so each is
convex (no path leaves a stage and re-enters it): a node between two nodes of
one run in a topological order would sit inside the run. The order is chosen
to keep same-backend nodes together: Kahn's algorithm that stays on the
current backend while it can; on a switch, one variant per backend puts that
backend's nodes off as long as possible; the cheapest variant is kept.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from backends.errors import ModelLoadError
from edge_runtime.planning.cost import BackendSpeed
from edge_runtime.planning.graph import GraphView

EPS_S = 1e-9  # differences below this are float noise, not progress


@dataclass(frozen=True)
class CostTable:
    """What the partitioner knows: seconds per node per backend, claims, tensor sizes, speeds."""

    node_s: Mapping[str, tuple[float, ...]]
    claims: Mapping[str, frozenset[int]]
    tensor_bytes: Mapping[str, int]
    speeds: Mapping[str, BackendSpeed]


@dataclass(frozen=True)
class StageSpec:
    """One stage: a backend, its nodes in run order, boundary tensors and estimated seconds.

    ``exchange_s`` is the part of ``copy_s`` spent on tensors handed to or from
    other stages (not graph inputs/outputs, which some stage must move anyway).
    """

    backend: str
    nodes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    compute_s: float
    copy_bytes: int
    copy_s: float
    exchange_s: float
    overhead_s: float

    @property
    def est_s(self) -> float:
        return self.compute_s + self.copy_s + self.overhead_s

    def to_dict(self, view: GraphView, table: CostTable) -> dict[str, Any]:
        def tensors(names: tuple[str, ...]) -> list[dict[str, Any]]:
            return [{"name": n, "bytes": table.tensor_bytes.get(n, 0)} for n in names]

        return {"backend": self.backend, "node_count": len(self.nodes),
                "first_node": view.nodes[self.nodes[0]].label, "last_node": view.nodes[self.nodes[-1]].label,
                "est_ms": round(self.est_s * 1e3, 4), "compute_ms": round(self.compute_s * 1e3, 4),
                "copy_ms": round(self.copy_s * 1e3, 4), "copy_bytes": self.copy_bytes,
                "inputs": tensors(self.inputs), "outputs": tensors(self.outputs)}


@dataclass(frozen=True)
class Partition:
    """Stages in run order; estimates of one request's latency and each backend's busy time."""

    stages: tuple[StageSpec, ...]

    @property
    def latency_s(self) -> float:
        return sum(s.est_s for s in self.stages)

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.backend for s in self.stages))

    def busy_s(self) -> dict[str, float]:
        busy: dict[str, float] = {}
        for s in self.stages:
            busy[s.backend] = busy.get(s.backend, 0.0) + s.est_s
        return busy

    @property
    def bottleneck_s(self) -> float:
        """Time per request of a full pipeline: the busiest backend's share."""
        return max(self.busy_s().values(), default=0.0)


def layout(view: GraphView, table: CostTable, assignment: Sequence[str]) -> Partition:
    """Stages for a fixed node -> backend assignment, along the best grouping order."""
    best: Partition | None = None
    for defer in (None, *sorted(set(assignment))):
        candidate = cut_stages(view, table, assignment, grouped_order(view, assignment, defer))
        if best is None or better((candidate.latency_s, len(candidate.stages)),
                                   (best.latency_s, len(best.stages))):
            best = candidate
    assert best is not None
    return best


def better(key: tuple[float, float], best: tuple[float, float]) -> bool:
    """Lexicographic ``key < best`` where the first (seconds) differs only beyond float noise."""
    if abs(key[0] - best[0]) > EPS_S:
        return key[0] < best[0]
    return key[1] < best[1]


def assignment_of(stages: Sequence[StageSpec], node_count: int) -> list[str]:
    placed = [""] * node_count
    for stage in stages:
        for n in stage.nodes:
            placed[n] = stage.backend
    return placed


def move_stage(view: GraphView, table: CostTable, stages: list[StageSpec], i: int,
          backend: str) -> tuple[list[StageSpec], float]:
    """Stage ``i`` moved to ``backend`` in the same order, merged with neighbours already there.

    Returns the new stages and the change in estimated latency; stages
    outside the merged window keep their node sets, so their specs hold.
    """
    lo, hi = i, i + 1
    if lo > 0 and stages[lo - 1].backend == backend:
        lo -= 1
    if hi < len(stages) and stages[hi].backend == backend:
        hi += 1
    merged = stage_spec(view, table, backend, tuple(n for s in stages[lo:hi] for n in s.nodes))
    return [*stages[:lo], merged, *stages[hi:]], merged.est_s - sum(s.est_s for s in stages[lo:hi])


def grouped_order(view: GraphView, assignment: Sequence[str], defer: str | None) -> list[int]:
    """A topological order that stays on one backend while it can (see module docstring)."""
    indegree = [len(p) for p in view.predecessors]
    ready: dict[str, list[int]] = {}
    for n in range(len(view)):
        if indegree[n] == 0:
            heapq.heappush(ready.setdefault(assignment[n], []), n)
    order: list[int] = []
    current: str | None = None
    while any(ready.values()):
        if current is None or not ready.get(current):
            waiting = [b for b, heap in ready.items() if heap]
            preferred = [b for b in waiting if b != defer] or waiting
            current = min(preferred, key=lambda b: ready[b][0])
        n = heapq.heappop(ready[current])
        order.append(n)
        for s in view.successors[n]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready.setdefault(assignment[s], []), s)
    if len(order) != len(view):
        stuck = [view.nodes[n].label for n in range(len(view)) if indegree[n] > 0]
        raise ModelLoadError(f"graph has a cycle through {len(stuck)} node(s), e.g. {stuck[:3]}")
    return order


def cut_stages(view: GraphView, table: CostTable, assignment: Sequence[str], order: list[int]) -> Partition:
    runs: list[tuple[str, list[int]]] = []
    for n in order:
        if runs and runs[-1][0] == assignment[n]:
            runs[-1][1].append(n)
        else:
            runs.append((assignment[n], [n]))
    return Partition(tuple(stage_spec(view, table, backend, tuple(nodes)) for backend, nodes in runs))


def stage_spec(view: GraphView, table: CostTable, backend: str, nodes: tuple[int, ...]) -> StageSpec:
    """Boundary tensors and costs of ``nodes`` (in run order) as one stage on ``backend``."""
    members = set(nodes)
    produced = {t for n in nodes for t in view.nodes[n].outputs}
    inputs = tuple(dict.fromkeys(t for n in nodes for t in view.nodes[n].inputs if t not in produced))
    outputs = tuple(t for n in nodes for t in view.nodes[n].outputs
                    if t in view.graph_output_set or any(c not in members for c in view.consumers.get(t, ())))
    speed = table.speeds[backend]
    copies = [(t, table.tensor_bytes.get(t, 0)) for t in (*inputs, *outputs)]
    node_s = table.node_s[backend]
    return StageSpec(
        backend=backend, nodes=nodes, inputs=inputs, outputs=outputs,
        compute_s=sum(node_s[n] for n in nodes),
        copy_bytes=0 if speed.on_host else sum(b for _, b in copies),
        copy_s=sum(speed.copy_s(b) for _, b in copies),
        exchange_s=sum(speed.copy_s(b) for t, b in copies if t not in view.graph_io),
        overhead_s=speed.stage_us * 1e-6)
