"""From an analysed graph plus bound input shapes to a device :class:`Program`.

Walks the nodes in order: host-known nodes are folded, device groups are
lowered when the walk reaches their last member. Every node that cannot be
handled is reported (with its reason), not just the first.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from backends.opencl.folding import FoldError, fold_node
from backends.opencl.fusion import Group
from backends.opencl.graph import GraphAnalysis
from backends.opencl.lowering import LoweringContext, NodeGroup, NotLowerableError, lower_group
from backends.opencl.plan import Program

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)


class SpecialisationError(Exception):
    """Nodes that could not be specialised: ``problems`` maps node label -> reason."""

    def __init__(self, problems: dict[str, str]) -> None:
        self.problems = dict(problems)
        super().__init__("; ".join(f"{k}: {v}" for k, v in self.problems.items()))


def _resolve(analysis: GraphAnalysis, group: Group) -> NodeGroup:
    nodes = analysis.model.graph.node
    pick = lambda index: nodes[index] if index is not None else None  # noqa: E731
    label = "+".join(analysis.labels[i] for i in group.members)
    return NodeGroup(nodes[group.head], pick(group.batchnorm), pick(group.bias_add),
                     tuple(nodes[i] for i in group.activations), label, pick(group.residual))


def specialise(analysis: GraphAnalysis, groups: list[Group], input_shapes: dict[str, tuple[int, ...]],
               input_values: dict[str, "np.ndarray"]) -> Program:
    """The device program for these input shapes (and values of value-bound inputs).

    Raises SpecialisationError listing every node that could not be handled.
    """
    program = Program()
    values = dict(analysis.initializers)
    values.update(input_values)
    ctx = LoweringContext(program, values, analysis.opset)
    for spec in analysis.inputs:
        if spec.name not in analysis.value_inputs:
            ctx.input(spec.name, input_shapes[spec.name])
    by_last = {group.last: group for group in groups}
    runtime = set(analysis.runtime)
    poisoned: set[str] = set()
    problems: dict[str, str] = {}
    for index, node in enumerate(analysis.model.graph.node):
        outputs = [name for name in node.output if name]
        if any(name in poisoned for name in node.input if name):
            poisoned.update(outputs)
            continue
        if index not in runtime:
            try:
                results = fold_node(node, values, ctx.shape, analysis.opset)
            except (FoldError, NotLowerableError) as exc:
                problems[analysis.labels[index]] = str(exc)
                poisoned.update(outputs)
                continue
            values.update({name: value for name, value in zip(node.output, results) if name})
            program.folded_nodes += 1
            continue
        group = by_last.get(index)
        if group is None:
            continue  # an earlier member of a group lowered at its last member
        resolved = _resolve(analysis, group)
        try:
            lower_group(ctx, resolved)
        except NotLowerableError as exc:
            for member in group.members:
                problems[analysis.labels[member]] = str(exc)
                poisoned.update(n for n in analysis.model.graph.node[member].output if n)
            continue
        if len(group.members) > 1:
            program.fused.append(resolved.label)
    for spec in analysis.outputs:
        if spec.name in program.tensors:
            program.outputs.append(spec.name)
        elif spec.name in values:
            program.outputs.append(spec.name)
            program.host_outputs[spec.name] = values[spec.name]
        elif spec.name not in poisoned:
            problems[f"output {spec.name}"] = "graph output is never produced"
    if problems:
        raise SpecialisationError(problems)
    return program
