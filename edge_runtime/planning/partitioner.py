"""Partitioner: which backend runs each node, in three strategies over one cost table.

Each strategy is deterministic for the same graph and cost table, and cuts
its assignment into convex stages with ``layout.layout``:

* ``fastest``: every node on its cheapest claiming backend, then whole
  stages move to another backend while that lowers the estimated latency
  (this dissolves islands too small to pay for their copies);
* ``offload``: every node the accelerator claims goes there; an accelerator
  island that spends longer on the copies it adds than on its compute goes
  back to the host;
* ``pipeline``: the topological order is cut in two, one side per backend,
  where the busier backend is least busy (the throughput of a pipeline), then
  islands are cleaned as in ``offload``.
"""

from __future__ import annotations

import logging
from typing import Sequence

from backends.errors import UnsupportedNodesError
from edge_runtime.planning.graph import GraphView
from edge_runtime.planning.layout import (
    EPS_S,
    CostTable,
    Partition,
    StageSpec,
    assignment_of,
    better,
    grouped_order,
    layout,
    move_stage,
)

log = logging.getLogger(__name__)

def check_claimed(view: GraphView, table: CostTable, backends: Sequence[str]) -> None:
    """Raise UnsupportedNodesError if some node is claimed by none of ``backends``."""
    orphans = [n.label for n in view.nodes if not any(n.index in table.claims[b] for b in backends)]
    if orphans:
        raise UnsupportedNodesError("+".join(backends), orphans)


def fastest(view: GraphView, table: CostTable, backends: Sequence[str]) -> Partition:
    """Lowest estimated latency: cheapest backend per node, then whole-stage moves while they help."""
    check_claimed(view, table, backends)
    greedy = [min((b for b in backends if n.index in table.claims[b]), key=lambda b: table.node_s[b][n.index])
               for n in view.nodes]
    current = layout(view, table, greedy)
    while True:
        stages = list(current.stages)
        while True:  # whole-stage moves along the current order, best first, while they help
            moves = [(move_stage(view, table, stages, i, b)[1], i, b) for i, stage in enumerate(stages)
                     for b in backends if b != stage.backend and _claims_all(table, b, stage)]
            gain = min(moves, default=None)
            if gain is None or gain[0] >= -EPS_S:
                break
            stages = move_stage(view, table, stages, gain[1], gain[2])[0]
        relaid = layout(view, table, assignment_of(stages, len(view)))
        moved = Partition(tuple(stages))
        if not relaid.latency_s < moved.latency_s - EPS_S:
            return moved if moved.latency_s < current.latency_s - EPS_S else current
        current = relaid


def offload(view: GraphView, table: CostTable, accelerator: str, host: str) -> Partition:
    """Everything the accelerator claims on it; islands not worth their copies back on the host."""
    check_claimed(view, table, (accelerator, host))
    placed = [accelerator if n.index in table.claims[accelerator] else host for n in view.nodes]
    return _drop_copy_bound_islands(view, table, placed, accelerator, host)


def pipeline(view: GraphView, table: CostTable, accelerator: str, host: str, candidates: int = 4) -> Partition:
    """Two-sided cut of the topological order balancing accelerator and host busy time."""
    check_claimed(view, table, (accelerator, host))
    order = grouped_order(view, [""] * len(view), None)
    claimed = table.claims[accelerator]
    scored: list[tuple[float, int, int]] = []
    for orientation, (first, second) in enumerate(((accelerator, host), (host, accelerator))):
        head = _cumulative_busy(table, order, first, host, claimed)
        tail = _cumulative_busy(table, order[::-1], second, host, claimed)
        for k in range(1, len(order)):
            busy = [head[k][b] + tail[len(order) - k][b] for b in (accelerator, host)]
            scored.append((max(busy), orientation, k))
    best: Partition | None = None
    for _, orientation, k in sorted(scored)[:candidates]:
        first, second = (accelerator, host) if orientation == 0 else (host, accelerator)
        placed = [""] * len(view)
        for position, n in enumerate(order):
            side = first if position < k else second
            placed[n] = side if side == host or n in claimed else host
        candidate = _drop_copy_bound_islands(view, table, placed, accelerator, host)
        if best is None or better((candidate.bottleneck_s, candidate.latency_s),
                                   (best.bottleneck_s, best.latency_s)):
            best = candidate
    if best is None:  # a single node cannot be cut in two
        return offload(view, table, accelerator, host)
    return best


def _cumulative_busy(table: CostTable, nodes: list[int], side: str, host: str,
                     claimed: frozenset[int]) -> list[dict[str, float]]:
    """``result[k]``: busy seconds per backend of ``nodes[:k]`` placed on ``side`` (unclaimed: host)."""
    busy = {b: 0.0 for b in table.node_s}
    result = [dict(busy)]
    for n in nodes:
        placed = side if side == host or n in claimed else host
        busy[placed] += table.node_s[placed][n]
        result.append(dict(busy))
    return result


def _drop_copy_bound_islands(view: GraphView, table: CostTable, placed: list[str], accelerator: str,
                             host: str) -> Partition:
    current = layout(view, table, placed)
    while True:
        stages = list(current.stages)
        moved = 0
        while (worst := _worst_island(table, stages, accelerator, host)) is not None:
            moved += len(stages[worst].nodes)
            stages = move_stage(view, table, stages, worst, host)[0]
        if not moved:
            return current
        log.debug("%d node(s) on %s did not pay for their copies: moved to %s", moved, accelerator, host)
        current = layout(view, table, assignment_of(stages, len(view)))


def _worst_island(table: CostTable, stages: list[StageSpec], accelerator: str, host: str) -> int | None:
    """The accelerator stage whose added copies exceed its compute the most, if any."""
    worst: tuple[float, int] | None = None
    if len(stages) < 2:
        return None
    for i, stage in enumerate(stages):
        if stage.backend != accelerator or not _claims_all(table, host, stage):
            continue
        excess = stage.exchange_s + stage.overhead_s - stage.compute_s
        if excess >= 0 and (worst is None or excess > worst[0]):
            worst = (excess, i)
    return None if worst is None else worst[1]


def _claims_all(table: CostTable, backend: str, stage: StageSpec) -> bool:
    claimed = table.claims[backend]
    return all(n in claimed for n in stage.nodes)


