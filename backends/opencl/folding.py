"""Evaluating host-known nodes at compile time (constant folding).

Shape and Size read the bound input shapes; every other node is evaluated
with the ONNX reference implementation under the model's opset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from backends.opencl.attrs import node_attrs

if TYPE_CHECKING:
    import onnx


class FoldError(Exception):
    """A host-known node could not be evaluated (internal; reported per node)."""


def fold_node(node: "onnx.NodeProto", values: dict[str, np.ndarray],
              shape_of: Callable[[str], tuple[int, ...]], opset: int) -> list[np.ndarray]:
    """The node's output values, in output order."""
    if node.op_type == "Shape":
        shape = shape_of(node.input[0])
        attrs = node_attrs(node)
        start, end = int(attrs.get("start", 0)), attrs.get("end")
        dims = shape[start:] if end is None else shape[start:int(end)]
        return [np.array(dims, dtype=np.int64)]
    if node.op_type == "Size":
        return [np.array(int(np.prod(shape_of(node.input[0]))), dtype=np.int64)]
    from onnx.reference import ReferenceEvaluator

    feeds = {}
    for name in node.input:
        if not name:
            continue
        if name not in values:
            raise FoldError(f"input {name!r} is not known at compile time")
        feeds[name] = values[name]
    if node.op_type == "GridSample" and opset < 20:
        node, opset = _grid_sample_20(node), 20
    try:
        evaluator = ReferenceEvaluator(node, opsets={"": opset})
        results = evaluator.run(None, feeds)
    except Exception as exc:  # the reference ops raise many types; all mean "cannot fold"
        raise FoldError(f"cannot evaluate {node.op_type} on the host: {exc}") from exc
    return [np.asarray(r) for r in results]


# GridSample's modes as opset 16 spells them -> opset 20's names (same interpolation)
_GRID_SAMPLE_MODES = {"bilinear": "linear", "bicubic": "cubic"}


def _grid_sample_20(node: "onnx.NodeProto") -> "onnx.NodeProto":
    """An opset-16 GridSample as opset 20 writes it. NOTE: onnx's reference GridSample knows only opset
    20's mode names and refuses "bicubic"/"bilinear" under any opset (GLM-4.1V's position table is
    resampled with "bicubic" in an opset-17 graph)."""
    import onnx

    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for attr in copy.attribute:
        if attr.name == "mode" and attr.s.decode() in _GRID_SAMPLE_MODES:
            attr.s = _GRID_SAMPLE_MODES[attr.s.decode()].encode()
    return copy
