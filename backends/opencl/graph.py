"""Structural facts about an ONNX graph, computed once at compile time.

Which tensors are known before a run (initializers, Constant outputs, shapes
once the input shapes are bound, inputs bound by value) and so fold on the
host; which nodes run on the device; which graph inputs are parameters
(a Resize's scales, a Reshape's shape) or small integer metadata tables
(Qwen2-VL's ``grid_thw``) bound by value like dynamic dims.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.base import TensorSpec
from backends.onnx_graph import graph_inputs, graph_outputs, op_names, tensor_specs
from backends.opencl.attrs import opset_of
from backends.opencl.support import FOLD_ONLY, KERNEL_OPS, NONDETERMINISTIC, PARAM_SLOTS, claim, inputs_are_integral

if TYPE_CHECKING:
    import numpy as np
    import onnx

# Nodes whose results need no input values once shapes are bound.
_STATIC_WITHOUT_VALUES = frozenset({"Shape", "Size", "Constant"})
METADATA_ROW = 16  # most values per row of an integer input bound by value as a metadata table


@dataclass(frozen=True)
class GraphAnalysis:
    model: "onnx.ModelProto"
    opset: int
    labels: tuple[str, ...]
    specs: dict[str, TensorSpec]  # inferred specs (symbolic dims kept)
    inputs: list[TensorSpec]  # real graph inputs, in order
    outputs: list[TensorSpec]
    initializers: dict[str, "np.ndarray"]
    value_inputs: frozenset[str]  # graph inputs bound by value at specialisation
    static: frozenset[str]  # tensors known on the host at specialisation
    runtime: tuple[int, ...]  # node indices computed on the device
    folded: tuple[int, ...]  # node indices evaluated on the host

    @property
    def nodes(self) -> list["onnx.NodeProto"]:
        return list(self.model.graph.node)

    def is_dynamic(self) -> bool:
        """Whether a run's feeds choose the specialisation (symbolic dims or value inputs)."""
        return bool(self.value_inputs) or not all(s.is_static() for s in self.inputs)


def _is_metadata_table(spec: TensorSpec) -> bool:
    """An integer input of a few values per row: [rows, k] with k static and at most ``METADATA_ROW``.

    Qwen2-VL's ``grid_thw`` [images, 3] is one; per-token tensors (ids, masks,
    positions) have a dynamic or long last dim and never are.
    """
    if not re.fullmatch(r"u?int\d+", spec.dtype) or len(spec.shape) < 2:
        return False
    row = spec.shape[1:]
    return all(isinstance(d, int) and d > 0 for d in row) and math.prod(row) <= METADATA_ROW


def _value_inputs(model: "onnx.ModelProto", inputs: list[TensorSpec],
                  specs: dict[str, TensorSpec]) -> frozenset[str]:
    """Graph inputs bound by value: parameters (a Reshape's shape...) and metadata tables.

    A metadata table (``_is_metadata_table``) read only by integer shape
    arithmetic decides shapes and positions, not data: binding it folds what
    it derives (a VLM's rotary tables and attention mask from ``grid_thw``)
    once per distinct value instead of leaving it to the host at every run.
    """
    uses: dict[str, list["onnx.NodeProto"]] = {}
    for node in model.graph.node:
        for name in node.input:
            if name:
                uses.setdefault(name, []).append(node)
    outputs = {o.name for o in model.graph.output}
    bound = set()
    for spec in inputs:
        used = uses.get(spec.name, [])
        if not used or spec.name in outputs:
            continue
        if all(slot in PARAM_SLOTS.get(node.op_type, ()) for node in used
               for slot, name in enumerate(node.input) if name == spec.name):
            bound.add(spec.name)
        elif _is_metadata_table(spec) and all(
                node.op_type in FOLD_ONLY and inputs_are_integral(node, specs) for node in used):
            bound.add(spec.name)
    return frozenset(bound)


def analyse(model: "onnx.ModelProto") -> GraphAnalysis:
    """Analyse ``model`` (not modified); cheap: no kernel is built."""
    from onnx import numpy_helper

    inputs = graph_inputs(model)
    specs = tensor_specs(model)
    initializers = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    value_inputs = _value_inputs(model, inputs, specs)
    static = set(initializers) | set(value_inputs)
    runtime, folded = [], []
    for index, node in enumerate(model.graph.node):
        needed = [name for name in node.input if name]
        is_static = node.op_type not in NONDETERMINISTIC and (
            node.op_type in _STATIC_WITHOUT_VALUES or all(name in static for name in needed))
        if is_static:
            static.update(name for name in node.output if name)
            folded.append(index)
        else:
            runtime.append(index)
    return GraphAnalysis(
        model=model, opset=opset_of(model), labels=tuple(op_names(model.graph.node)),
        specs=specs, inputs=inputs, outputs=graph_outputs(model),
        initializers=initializers, value_inputs=value_inputs, static=frozenset(static),
        runtime=tuple(runtime), folded=tuple(folded))


def unclaimed(analysis: GraphAnalysis) -> dict[str, str]:
    """Label -> reason for every node the backend cannot take (empty when all fit)."""
    nodes = analysis.nodes
    problems: dict[str, str] = {}
    for index in analysis.runtime:
        node = nodes[index]
        reason = claim(node, analysis.specs)
        if reason is None and node.op_type not in KERNEL_OPS:
            reason = f"{node.op_type} depends on runtime data (only folded at compile time)"
        elif reason is None and node.op_type not in ("Shape", "Size") and not _float_data(node, analysis):
            reason = f"{node.op_type} on non-float32 runtime data"
        if reason is not None:
            problems[analysis.labels[index]] = reason
    for index in analysis.folded:
        node = nodes[index]
        if node.domain not in ("", "ai.onnx"):
            problems[analysis.labels[index]] = f"domain {node.domain!r} is not ai.onnx"
    return problems


def _float_data(node: "onnx.NodeProto", analysis: GraphAnalysis) -> bool:
    from backends.opencl.support import data_is_float

    return data_is_float(node, analysis.specs) is not False
