"""QDQ units: the float nodes of a QDQ model that ONNX Runtime runs as one integer kernel.

In a QDQ model a quantized op is written in float between ``DequantizeLinear``
and ``QuantizeLinear`` nodes (DQ -> Conv -> Q). ONNX Runtime's CPU provider
fuses each such unit into an integer kernel (``QLinearConv``, ...), whose
rounding differs from the float arithmetic the graph spells out by up to one
quantization step per unit. An accelerator computing the unit in float would
therefore answer differently from the host on the same model; so the planner
keeps every unit on the host, and a QDQ model equals plain ONNX Runtime on
every plan. The float nodes outside units (a tail left unquantized) may move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx


def qdq_units(model: "onnx.ModelProto") -> frozenset[int]:
    """Indices of nodes that read a DequantizeLinear output and feed a QuantizeLinear."""
    nodes = model.graph.node
    producer = {out: i for i, node in enumerate(nodes) for out in node.output}
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            consumers.setdefault(name, []).append(i)
    units = set()
    for i, node in enumerate(nodes):
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        reads_dq = any(nodes[producer[t]].op_type == "DequantizeLinear" for t in node.input if t in producer)
        feeds_q = any(nodes[c].op_type == "QuantizeLinear" for t in node.output for c in consumers.get(t, ()))
        if reads_dq and feeds_q:
            units.add(i)
    return frozenset(units)
