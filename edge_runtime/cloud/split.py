"""Cutting an ONNX model in two: the head runs on the device, the tail in the cloud.

A cut at index ``k`` puts the first ``k`` nodes of the prepared graph's
topological order (Constants lifted, see ``planning.graph.prepare``) in the
head and the rest in the tail. The tensors crossing it are every tensor
available before ``k`` (a graph input, or an output of a head node) that a
tail node reads: on a chain that is one activation; on a DAG it can be
several (a residual's skip branch, the original input that a late Shape
reads). Graph outputs the head already produces come back from the head.

Candidate cuts are the positions whose crossing set is small (at most
``max_tensors`` tensors); when there are many, the ones moving the fewest
bytes are kept, since those are the cuts worth paying a network hop for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from backends.base import TensorSpec
from backends.onnx_graph import graph_inputs
from edge_runtime.errors import InvalidInputError, ModelLoadError

if TYPE_CHECKING:
    import numpy as np
    import onnx

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cut:
    """Where a model is cut and what crosses.

    ``tensors`` lists every tensor crossing the cut (the manifest's ``cut_tensors``);
    ``passthrough`` are those that are graph inputs (sent from the feeds, the
    head does not produce them); ``head_outputs`` what the head computes
    (crossing tensors it produces plus graph outputs it already finishes);
    ``tail_outputs`` the graph outputs the tail produces. ``nbytes`` is the
    crossing size at the bound input shapes (None: a shape is unknown).
    """

    index: int
    tensors: tuple[str, ...]
    passthrough: tuple[str, ...]
    head_inputs: tuple[str, ...]
    head_outputs: tuple[str, ...]
    tail_outputs: tuple[str, ...]
    nbytes: int | None
    last_head_node: str

    @property
    def name(self) -> str:
        return f"split@{self.index}"

    def to_dict(self) -> dict[str, Any]:
        return {"cut_index": self.index, "cut_tensors": list(self.tensors), "cut_bytes": self.nbytes,
                "passthrough": list(self.passthrough), "last_head_node": self.last_head_node,
                "head_inputs": list(self.head_inputs), "head_outputs": list(self.head_outputs),
                "tail_outputs": list(self.tail_outputs)}


class ModelCutter:
    """Cuts for one model: crossing sets, candidates, and head/tail extraction.

    ``input_shapes`` binds dynamic input dimensions for the byte counts
    (default: batch 1, see ``planning.cost.bound_input_shapes``).
    """

    def __init__(self, model: "onnx.ModelProto", input_shapes: Mapping[str, Sequence[int]] | None = None) -> None:
        from edge_runtime.planning.cost import bound_input_shapes, bound_tensor_specs
        from edge_runtime.planning.graph import GraphView, prepare

        self.prepared = prepare(model).model
        self.view = GraphView(self.prepared)
        self.inputs = graph_inputs(self.prepared)
        self.input_shapes = bound_input_shapes(self.inputs, input_shapes)
        self.specs: dict[str, TensorSpec] = bound_tensor_specs(self.prepared, self.input_shapes)
        count = len(self.view)
        # A tensor is live at cut k when it exists before k (born <= k) and a node at >= k reads it.
        self._born: dict[str, int] = {name: 0 for name in self.view.graph_inputs}
        for node in self.view.nodes:
            for name in node.outputs:
                self._born[name] = node.index + 1
        self._last_read: dict[str, int] = {name: max(readers) for name, readers in self.view.consumers.items()}
        self.node_count = count
        self._extractor: Any = None

    # -- cuts ------------------------------------------------------------------------------
    def cut_at(self, index: int) -> Cut:
        """The cut after the first ``index`` nodes (1 <= index < node count)."""
        if not 1 <= index < self.node_count:
            raise InvalidInputError(f"cut index must be in 1..{self.node_count - 1}, got {index}")
        crossing = tuple(name for name, born in self._born.items()
                         if born <= index and self._last_read.get(name, -1) >= index)
        graph_in = set(self.view.graph_inputs)
        passthrough = tuple(name for name in crossing if name in graph_in)
        finished = tuple(name for name in self.view.graph_outputs
                         if name not in graph_in and self._born.get(name, index + 1) <= index)
        head_outputs = tuple(dict.fromkeys([*(t for t in crossing if t not in graph_in), *finished]))
        tail_outputs = tuple(name for name in self.view.graph_outputs if self._born.get(name, 0) > index)
        head_inputs = tuple(name for name in self.view.graph_inputs
                            if any(reader < index for reader in self.view.consumers.get(name, ())))
        return Cut(index, crossing, passthrough, head_inputs, head_outputs, tail_outputs,
                   self._bytes(crossing), self.view.nodes[index - 1].label)

    def resolve(self, at: str) -> Cut:
        """The cut right after tensor ``at`` is produced, or after node ``at`` (its outputs).

        Raises InvalidInputError naming the candidates when ``at`` is neither.
        """
        index = None
        if at in self.view.producer:
            index = self.view.producer[at] + 1
        else:
            named = [node.index for node in self.view.nodes if self.prepared.graph.node[node.index].name == at]
            if named:
                index = named[0] + 1
        if index is None:
            if at in self.view.graph_inputs or at in self.view.initializers:
                raise InvalidInputError(f"cannot cut at {at!r}: it is a graph input or weight, not a computed tensor")
            sample = [n.outputs[0] for n in self.view.nodes[:8] if n.outputs]
            raise InvalidInputError(f"cannot cut at {at!r}: no node or tensor has that name (tensors e.g. {sample})")
        if index >= self.node_count:
            raise InvalidInputError(f"cannot cut at {at!r}: it is made by the last node, the tail would be empty")
        return self.cut_at(index)

    def candidates(self, max_tensors: int = 4, max_candidates: int = 16) -> list[Cut]:
        """Cuts worth considering, in graph order (see the module docstring)."""
        cuts = []
        for index in range(1, self.node_count):
            cut = self.cut_at(index)
            if len(cut.tensors) <= max_tensors and cut.nbytes is not None and cut.tail_outputs:
                cuts.append(cut)
        # Runs of positions with the same crossing set (Shape, Reshape, ...) are one choice: keep its last.
        distinct = [c for i, c in enumerate(cuts) if i + 1 == len(cuts) or cuts[i + 1].tensors != c.tensors]
        if len(distinct) > max_candidates:
            keep = sorted(distinct, key=lambda c: (c.nbytes, c.index))[:max_candidates]
            distinct = sorted(keep, key=lambda c: c.index)
        return distinct

    def _bytes(self, names: Sequence[str]) -> int | None:
        from edge_runtime.planning.cost import tensor_bytes

        total = 0
        for name in names:
            size = tensor_bytes(self.specs.get(name))
            if size is None:
                return None
            total += size
        return total

    def sample_feeds(self, seed: int = 0) -> dict[str, "np.ndarray"]:
        """Seeded random inputs at the bound shapes (for timing heads)."""
        from edge_runtime.feeds import random_feeds

        return random_feeds([TensorSpec(s.name, s.dtype, self.input_shapes[s.name]) for s in self.inputs], seed)

    def output_bytes(self, names: Sequence[str]) -> int:
        """Bytes of the named tensors at the bound shapes (unknown ones count 0)."""
        return sum(self._bytes([name]) or 0 for name in names)

    # -- extraction ------------------------------------------------------------------------
    def extract(self, cut: Cut) -> tuple["onnx.ModelProto", "onnx.ModelProto"]:
        """``(head, tail)`` as standalone ONNX models; raises ModelLoadError for an untyped crossing tensor."""
        from edge_runtime.planning.partitioner import StageSpec
        from edge_runtime.planning.stages import StageExtractor

        if self._extractor is None:
            self._extractor = StageExtractor(self.prepared, self.view)

        def stage(nodes: range, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> StageSpec:
            return StageSpec("cpu", tuple(nodes), inputs, outputs, 0.0, 0, 0.0, 0.0, 0.0)

        if not cut.head_outputs:
            raise ModelLoadError(f"{cut.name}: the head would compute nothing the tail or the caller needs")
        head = self._extractor.extract(stage(range(cut.index), cut.head_inputs, cut.head_outputs), "head")
        tail = self._extractor.extract(stage(range(cut.index, self.node_count), cut.tensors, cut.tail_outputs),
                                       "tail")
        return head, tail
