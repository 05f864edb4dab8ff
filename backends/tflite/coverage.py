"""How much of a model a delegate took: nodes and partitions, read from the interpreter's node list.

LiteRT does not expose the execution plan to Python, but it keeps every
original node in the primary subgraph's node list and *appends* one node per
delegated partition (``op_name == "DELEGATE"``) whose inputs and outputs are
the partition's boundary tensors. So:

* the original nodes are indices ``[0, original)``;
* a delegate's partitions are the nodes it appended (an external delegate is
  applied in the Interpreter constructor; the default XNNPACK delegate lazily,
  at the first ``allocate_tensors``);
* the original nodes inside a partition are found by walking back from its
  outputs through their producers until its inputs are reached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LOW_COVERAGE_FRACTION = 0.5
"""Below this delegated fraction, with more than one partition, a delegate plan is "low coverage"."""


@dataclass(frozen=True)
class Coverage:
    """Nodes of the primary subgraph a delegate runs, in how many partitions, out of how many."""

    nodes_delegated: int
    partitions: int
    total_nodes: int

    @property
    def fraction(self) -> float:
        return self.nodes_delegated / self.total_nodes if self.total_nodes else 0.0

    @property
    def low_coverage(self) -> bool:
        """True when the work is split (partitions > 1) and under half the nodes are delegated.

        Every partition boundary costs a copy (and, on a GPU, a sync); a plan
        that hops back and forth for a minority of the nodes is usually slower
        than the CPU plan, so the scheduler should prefer the CPU.
        """
        return self.partitions > 1 and self.fraction < LOW_COVERAGE_FRACTION

    def to_dict(self) -> dict[str, Any]:
        return {"nodes_delegated": self.nodes_delegated, "partitions": self.partitions,
                "total_nodes": self.total_nodes, "low_coverage": self.low_coverage}


def node_count(interpreter: Any) -> int:
    """Nodes now in the primary subgraph's node list (original plus delegate nodes)."""
    # NOTE: never keep a reference to ``interpreter._interpreter``: LiteRT refuses
    # to allocate or invoke while anyone but the Interpreter holds it.
    return int(interpreter._interpreter.NumNodes())


def delegate_coverage(interpreter: Any, original: int, first: int, end: int) -> Coverage:
    """Coverage of the delegate whose partition nodes are ``[first, end)`` of the node list."""
    nodes = [_node(interpreter, i) for i in range(end)]
    producer = {tensor: i for i in range(original) for tensor in nodes[i][2]}
    covered: set[int] = set()
    partitions = 0
    for name, inputs, outputs in nodes[first:end]:
        if name != "DELEGATE":
            continue
        partitions += 1
        boundary = set(inputs)
        pending = list(outputs)
        while pending:
            tensor = pending.pop()
            node = producer.get(tensor)
            if tensor in boundary or node is None or node in covered:
                continue
            covered.add(node)
            pending.extend(nodes[node][1])
    return Coverage(len(covered), partitions, original)


def _node(interpreter: Any, index: int) -> tuple[str, list[int], list[int]]:
    """Op name, input and output tensor indices of one node (optional inputs, -1, left out)."""
    wrapper = interpreter._interpreter  # a local: released when this returns
    inputs = [int(t) for t in wrapper.NodeInputs(index) if t >= 0]
    outputs = [int(t) for t in wrapper.NodeOutputs(index) if t >= 0]
    return str(wrapper.NodeName(index)), inputs, outputs
