"""Stage extraction: each stage of a partition as a standalone ONNX model.

``onnx.utils.Extractor`` does the cutting: it takes the nodes between the
stage's input and output tensors and carries the initializers they read,
value_info, local functions, the opset imports and the IR version. It needs
a type for every boundary tensor, which the prepared (shape-inferred) model
provides (see ``graph.prepare``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from backends.errors import ModelLoadError
from edge_runtime.planning.graph import GraphView, outer_scope_names
from edge_runtime.planning.layout import StageSpec

if TYPE_CHECKING:
    import onnx
    import onnx.utils

log = logging.getLogger(__name__)


class StageExtractor:
    """Cuts stages out of one prepared model; build once, extract many stages."""

    def __init__(self, prepared: "onnx.ModelProto", view: GraphView) -> None:
        import onnx.utils

        self._model = prepared
        self._view = view
        self._extractor: onnx.utils.Extractor = onnx.utils.Extractor(prepared)

    def extract(self, stage: StageSpec, label: str) -> "onnx.ModelProto":
        """The subgraph computing ``stage.outputs`` from ``stage.inputs``.

        Raises ModelLoadError naming the tensors when a boundary tensor has no
        known type, or when the cut would need nodes outside the stage.
        """
        members = set(stage.nodes)
        produced = {t: n for n in stage.nodes for t in self._view.nodes[n].outputs}
        # Tensors that subgraphs (If/Loop bodies) read from this stage: Extractor follows only
        # formal inputs, so ask for them as extra outputs to keep their producers.
        formal = {t for n in stage.nodes for t in self._model.graph.node[n].input}
        implicit = [t for n in stage.nodes for t in self._view.nodes[n].inputs if t in produced and t not in formal]
        outputs = list(dict.fromkeys([*stage.outputs, *implicit]))
        untyped = [t for t in (*stage.inputs, *outputs) if t not in self._extractor.value_infos]
        if untyped:
            raise ModelLoadError(f"{label}: cannot cut the graph at tensor(s) {untyped}: "
                                 "shape inference gave them no type")
        sub = self._extractor.extract_model(list(stage.inputs), outputs)
        kept = {self._view.producer[o] for node in sub.graph.node for o in node.output if o in self._view.producer}
        strays = sorted(kept - members)
        if strays:
            raise ModelLoadError(f"{label}: the cut pulls in node(s) outside the stage: "
                                 f"{[self._view.nodes[n].label for n in strays[:5]]}")
        dead = len(members) - len(kept)
        if dead:
            log.debug("%s: %d node(s) with unused outputs dropped", label, dead)
        self._carry_outer_initializers(sub)
        sub.graph.name = label
        return sub

    def _carry_outer_initializers(self, sub: "onnx.ModelProto") -> None:
        """Add initializers read only from inside subgraphs (Extractor looks at formal inputs)."""
        have = {i.name for i in sub.graph.initializer}
        wanted = {t for node in sub.graph.node for t in outer_scope_names(node)} - have
        if not wanted:
            return
        for init in self._model.graph.initializer:
            if init.name in wanted:
                sub.graph.initializer.append(init)
