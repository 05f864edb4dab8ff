"""A read-only view of an ONNX graph for planning: nodes, producers, consumers.

Planning works on a *prepared* model: a copy of the original whose
``Constant`` nodes are lifted into initializers (so a constant never becomes a
boundary tensor between stages) and whose value_info comes from onnx shape
inference (so every boundary tensor has a type for the extracted subgraphs).
Nodes are referred to by their index in the prepared graph.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from backends.onnx_graph import graph_inputs, node_label

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeInfo:
    """One node: its data inputs (outer-scope names read by subgraphs included,
    initializers and empty names left out) and its non-empty outputs."""

    index: int
    label: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class PreparedModel:
    """A model ready for partitioning; ``lifted`` names the initializers that were
    ``Constant`` nodes (each counts as one node under the stage that reads it)."""

    model: "onnx.ModelProto"
    original_node_count: int
    lifted: frozenset[str]


def prepare(model: "onnx.ModelProto") -> PreparedModel:
    """Copy ``model``, lift its Constant nodes into initializers and infer value_info.

    Constants that are graph outputs stay nodes (an output must be produced).
    See ``infer_shapes`` for the value_info.
    """
    import onnx

    prepared = onnx.ModelProto()
    prepared.CopyFrom(model)
    graph = prepared.graph
    outputs = {o.name for o in graph.output}
    kept = []
    lifted: list[str] = []
    for node in graph.node:
        tensor = _constant_tensor(node) if node.op_type == "Constant" and node.domain in ("", "ai.onnx") else None
        if tensor is None or node.output[0] in outputs:
            kept.append(node)
            continue
        graph.initializer.append(tensor)
        lifted.append(tensor.name)
    del graph.node[:]
    graph.node.extend(kept)
    return PreparedModel(infer_shapes(prepared), len(model.graph.node), frozenset(lifted))


def infer_shapes(model: "onnx.ModelProto") -> "onnx.ModelProto":
    """``model`` with value_info from onnx shape inference (data propagation on).

    A failure leaves the value_info the exporter wrote. Where inference loses
    a shape (a Reshape to a computed shape) the type still comes through,
    which is all stage extraction needs.
    """
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # onnx raises InferenceError/ValidationError variants
        log.info("onnx shape inference failed on %s (%s)", model.graph.name, exc)
        return model


def _constant_tensor(node: "onnx.NodeProto") -> "onnx.TensorProto | None":
    """The tensor a Constant node makes, named like its output; None for forms we keep as nodes."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    if len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    if attr.name == "value":
        tensor = onnx.TensorProto()
        tensor.CopyFrom(attr.t)
    elif attr.name in ("value_float", "value_floats"):
        tensor = numpy_helper.from_array(np.asarray(attr.f if attr.name == "value_float" else list(attr.floats),
                                                    dtype=np.float32))
    elif attr.name in ("value_int", "value_ints"):
        tensor = numpy_helper.from_array(np.asarray(attr.i if attr.name == "value_int" else list(attr.ints),
                                                    dtype=np.int64))
    else:  # sparse and string constants stay Constant nodes
        return None
    tensor.name = node.output[0]
    return tensor


class GraphView:
    """Nodes, producers and consumers of a (prepared) graph; never mutates it."""

    def __init__(self, model: "onnx.ModelProto") -> None:
        graph = model.graph
        self.initializers = frozenset(init.name for init in graph.initializer)
        self.graph_inputs = tuple(spec.name for spec in graph_inputs(model))
        self.graph_outputs = tuple(out.name for out in graph.output)
        self.graph_output_set = frozenset(self.graph_outputs)
        self.graph_io = frozenset(self.graph_inputs) | self.graph_output_set
        nodes = []
        for index, node in enumerate(graph.node):
            reads = [*node.input, *outer_scope_names(node)]
            inputs = tuple(dict.fromkeys(n for n in reads if n and n not in self.initializers))
            nodes.append(NodeInfo(index, node_label(node, index), node.op_type, inputs,
                                  tuple(o for o in node.output if o)))
        self.nodes: tuple[NodeInfo, ...] = tuple(nodes)
        self.producer: dict[str, int] = {o: n.index for n in self.nodes for o in n.outputs}
        consumers: dict[str, list[int]] = {}
        for n in self.nodes:
            for name in n.inputs:
                consumers.setdefault(name, []).append(n.index)
        self.consumers: dict[str, tuple[int, ...]] = {k: tuple(v) for k, v in consumers.items()}
        self.predecessors: tuple[tuple[int, ...], ...] = tuple(
            tuple(sorted({self.producer[t] for t in n.inputs if t in self.producer})) for n in self.nodes)
        self.successors: tuple[tuple[int, ...], ...] = tuple(
            tuple(sorted({c for t in n.outputs for c in self.consumers.get(t, ())})) for n in self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)


def outer_scope_names(node: "onnx.NodeProto") -> Iterable[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies) read from the enclosing graph."""
    import onnx

    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for sub in graphs:
            defined = {i.name for i in sub.input} | {i.name for i in sub.initializer}
            for inner in sub.node:
                defined.update(inner.output)
            for inner in sub.node:
                for name in (*inner.input, *outer_scope_names(inner)):
                    if name and name not in defined:
                        yield name
