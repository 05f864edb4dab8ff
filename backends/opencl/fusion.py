"""Grouping device nodes so one kernel does the work of several.

Decided on the graph structure alone, once per compile:

* BatchNormalization folds into the Conv before it (weights rescaled on the
  host) when the Conv output feeds only that BN and all its parameters are
  host-known;
* a MatMul followed by an Add of a host-known tensor takes it as its bias;
* a Conv/Gemm/MatMul followed by an Add of another device tensor of the same
  shape (a residual connection) reads that tensor in its epilogue;
* element-wise nodes that compute from the producer's output and scalar
  constants only (Relu, Clip/ReLU6, HardSwish, also decomposed forms such as
  x * Clip(x + 3, 0, 6) / 6 or x * Sigmoid(x)) become one scalar function
  applied by the producing kernel before its store.

A group is lowered when the walk reaches its last member, so every tensor
its members read already exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.opencl.attrs import node_attrs
from backends.opencl.graph import GraphAnalysis
from backends.opencl.support import ACTIVATIONS, BINARY, PARAM_SLOTS

if TYPE_CHECKING:
    import onnx

MAX_EPILOGUE_NODES = 8
# Kernels that can add a residual tensor before their epilogue.
RESIDUAL_HEADS = frozenset({"Conv", "Gemm", "MatMul"})
# Kernels that apply ACTIVATE(v) before their store.
EPILOGUE_HEADS = ACTIVATIONS | BINARY | frozenset({
    "Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization", "MaxPool", "AveragePool",
    "GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
    "Resize",
})


@dataclass(frozen=True)
class Group:
    """Node indices lowered together; ``head`` defines the kernel."""

    head: int
    batchnorm: int | None = None
    bias_add: int | None = None
    activations: tuple[int, ...] = ()
    residual: int | None = None  # an Add of a same-shape device tensor, before the activations

    @property
    def members(self) -> tuple[int, ...]:
        extra = [i for i in (self.batchnorm, self.bias_add, self.residual) if i is not None]
        return (self.head, *extra, *self.activations)

    @property
    def last(self) -> int:
        return max(self.members)


def plan_groups(analysis: GraphAnalysis) -> list[Group]:
    """One group per device node or fused chain, in graph order of their heads."""
    nodes = analysis.nodes
    runtime = set(analysis.runtime)
    consumers: dict[str, list[int]] = {}
    for index, node in enumerate(nodes):
        for name in node.input:
            if name:
                consumers.setdefault(name, []).append(index)
    graph_outputs = {spec.name for spec in analysis.outputs}

    def sole_consumer(tensor: str) -> int | None:
        users = consumers.get(tensor, [])
        if tensor in graph_outputs or len(users) != 1 or users[0] not in runtime:
            return None
        return users[0]

    def params_static(node: "onnx.NodeProto", skip_first: bool = True) -> bool:
        names = node.input[1:] if skip_first else node.input
        return all(not n or n in analysis.static for n in names)

    absorbed: set[int] = set()
    groups = []
    for index in analysis.runtime:
        if index in absorbed:
            continue
        node = nodes[index]
        out = node.output[0]
        batchnorm = bias_add = None
        if node.op_type == "Conv" and params_static(node):
            user = sole_consumer(out)
            if user is not None and _is_inference_bn(nodes[user]) and params_static(nodes[user]):
                batchnorm, out = user, nodes[user].output[0]
        if node.op_type == "MatMul":
            user = sole_consumer(out)
            if user is not None and nodes[user].op_type == "Add":
                other = [n for n in nodes[user].input if n != out]
                if len(other) == 1 and other[0] in analysis.static:
                    bias_add, out = user, nodes[user].output[0]
        residual = None
        if node.op_type in RESIDUAL_HEADS:
            user = sole_consumer(out)
            if user is not None and _is_residual_add(nodes[user], out, analysis):
                residual, out = user, nodes[user].output[0]
        activations: list[int] = []
        if node.op_type in EPILOGUE_HEADS and len([o for o in node.output if o]) == 1:
            extra = {node.input[0]} if node.op_type in ACTIVATIONS else set()
            activations = _epilogue(out, extra, analysis, consumers, runtime, graph_outputs)
        group = Group(index, batchnorm, bias_add, tuple(activations), residual)
        absorbed.update(group.members)
        groups.append(group)
    return groups


def _is_residual_add(node: "onnx.NodeProto", source: str, analysis: GraphAnalysis) -> bool:
    """An Add of ``source`` and a device tensor of the same (fully known) shape."""
    if node.op_type != "Add" or len(node.input) != 2 or list(node.input).count(source) != 1:
        return False
    other = node.input[1] if node.input[0] == source else node.input[0]
    mine, theirs = analysis.specs.get(source), analysis.specs.get(other)
    return (other not in analysis.static and mine is not None and theirs is not None
            and mine.shape == theirs.shape and all(d is not None for d in mine.shape))


def _is_inference_bn(node: "onnx.NodeProto") -> bool:
    return (node.op_type == "BatchNormalization" and not node_attrs(node).get("training_mode", 0)
            and not any(node.output[1:]))


def _is_scalar_constant(name: str, analysis: GraphAnalysis, rank: int | None) -> bool:
    spec = analysis.specs.get(name)
    if name not in analysis.static or spec is None or not spec.is_static():
        return False
    size = 1
    for dim in spec.shape:
        size *= int(dim)
    return size == 1 and rank is not None and len(spec.shape) <= rank


def _fusable(node: "onnx.NodeProto", available: set[str], analysis: GraphAnalysis, rank: int | None) -> bool:
    """Whether ``node`` computes from ``available`` tensors and scalar constants only."""
    if node.op_type in ACTIVATIONS:
        params = PARAM_SLOTS.get(node.op_type, frozenset())
        return (bool(node.input) and node.input[0] in available
                and all(not n or n in analysis.static for i, n in enumerate(node.input) if i in params))
    if node.op_type in BINARY and len(node.input) == 2:
        inside = [n in available for n in node.input]
        return any(inside) and all(ok or _is_scalar_constant(n, analysis, rank)
                                   for ok, n in zip(inside, node.input))
    return False


def _epilogue(source: str, extra: set[str], analysis: GraphAnalysis, consumers: dict[str, list[int]],
              runtime: set[int], graph_outputs: set[str]) -> list[int]:
    """The largest closed set of element-wise nodes computing from ``source`` alone.

    Members take ``source`` (and ``extra``: a unary head's own input), their own
    results and scalar constants; every tensor they produce except the last is
    read only inside the set, so the whole set becomes one scalar function
    applied before the head's store.
    """
    nodes = analysis.model.graph.node
    spec = analysis.specs.get(source)
    rank = len(spec.shape) if spec is not None else None
    available = {source} | extra
    members: list[int] = []
    grown = True
    while grown and len(members) < MAX_EPILOGUE_NODES:
        grown = False
        for user in sorted({u for t in available for u in consumers.get(t, [])}):
            if user in runtime and user not in members and _fusable(nodes[user], available, analysis, rank):
                members.append(user)
                available.update(n for n in nodes[user].output if n)
                grown = True
                break
    members.sort()
    best: list[int] = []
    for k in range(1, len(members) + 1):
        prefix = set(members[:k])
        produced = {source} | {n for i in prefix for n in nodes[i].output if n}
        escaping = {t for t in produced
                    if t in graph_outputs or any(c not in prefix for c in consumers.get(t, []))}
        if escaping == {nodes[members[k - 1]].output[0]}:
            best = members[:k]
    return best
