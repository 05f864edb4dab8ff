"""Which ONNX nodes the WebGPU EP takes, asked of the EP itself (see ``webgpu``).

* one node: a one-node model with the node's tensor specs, CPU fallback
  disabled: a session that builds means the EP takes the node;
* a whole model: ONNX Runtime's assignment of the constant-folded graph
  (folded nodes count as the EP's: it compiled them away); a node
  it leaves on the CPU EP is asked alone as above, because ORT keeps small
  shape arithmetic (Shape→Gather→Concat) on the host even where the EP has a
  kernel. Nodes the EP refuses alone stay unclaimed; the partitioner gives
  them to ``cpu``.

The EP's word is overruled only for kernels measured wrong (``known_wrong``),
found by the shared op suite (tests/backends/test_backend_ops.py).

Answers are memoised by node signature / model digest (building a session
takes ~0.1 s).
"""

from __future__ import annotations

import hashlib
import threading
from typing import TYPE_CHECKING, Mapping

from backends.base import TensorSpec
from backends.vulkan import webgpu

if TYPE_CHECKING:
    import onnx

_ONNX_DTYPES = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
                "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13}


class Placement:
    """Memoised EP answers for one process."""

    def __init__(self) -> None:
        self._nodes: dict[bytes, bool] = {}
        self._models: dict[str, frozenset[int]] = {}
        self._lock = threading.Lock()

    def supports(self, node: "onnx.NodeProto", shapes: Mapping[str, TensorSpec], opset: int = 17) -> bool:
        if known_wrong(node, shapes):
            return False
        model = one_node_model(node, shapes, opset)
        if model is None:
            return False
        key = model.SerializeToString()
        with self._lock:
            known = self._nodes.get(key)
        if known is None:
            known = webgpu.takes_alone(model)
            with self._lock:
                self._nodes[key] = known
        return known

    def claims(self, model: "onnx.ModelProto", shapes: Mapping[str, TensorSpec]) -> frozenset[int]:
        digest = hashlib.sha256(model.SerializeToString()).hexdigest()
        with self._lock:
            if digest in self._models:
                return self._models[digest]
        host = webgpu.host_placed(model)
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
        claimed = frozenset(i for i, node in enumerate(model.graph.node)
                            if not known_wrong(node, shapes) and (node.name not in host or
                                                                  self.supports(node, shapes, opset)))
        with self._lock:
            self._models[digest] = claimed
        return claimed


def known_wrong(node: "onnx.NodeProto", shapes: Mapping[str, TensorSpec]) -> bool:
    """Nodes the EP takes but computes wrong (onnxruntime-ep-webgpu 0.4.0, measured on lavapipe).

    Grouped, non-depthwise Conv whose output channels per group are not a multiple
    of 4 (e.g. 6→10 channels in 2 groups: max |diff| 6.4 against the CPU EP);
    depthwise and 4-aligned groups are exact. Kept conservative: any such group count.
    """
    if node.op_type != "Conv" or len(node.input) < 2:
        return False
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    weight = shapes.get(node.input[1])
    if group <= 1 or weight is None or not isinstance(weight.shape[0], int) or not isinstance(weight.shape[1], int):
        return group > 1 and weight is None  # unknown weight shape of a grouped Conv: do not risk it
    depthwise = weight.shape[1] == 1
    return not depthwise and (weight.shape[0] // group) % 4 != 0


def one_node_model(node: "onnx.NodeProto", shapes: Mapping[str, TensorSpec], opset: int) -> "onnx.ModelProto | None":
    """``node`` alone, its inputs and outputs typed from ``shapes``; None when a spec is unknown or the
    node holds a subgraph (If/Loop/Scan are judged with their bodies, not alone)."""
    from onnx import AttributeProto, helper

    if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
        return None
    input_names = list(dict.fromkeys(n for n in node.input if n))  # Mul(x, x) reads one graph input
    values = []
    for name in (*input_names, *[n for n in node.output if n]):
        spec = shapes.get(name)
        if spec is None or spec.dtype not in _ONNX_DTYPES:
            return None
        dims = [d if isinstance(d, (int, str)) and d != -1 else None for d in spec.shape]
        values.append(helper.make_tensor_value_info(name, _ONNX_DTYPES[spec.dtype], dims))
    inputs, outputs = values[:len(input_names)], values[len(input_names):]
    bare = helper.make_node(node.op_type, list(node.input), list(node.output), domain=node.domain or None)
    bare.attribute.extend(node.attribute)
    graph = helper.make_graph([bare], "one_node", inputs, outputs)
    imports = [helper.make_opsetid("", opset)]
    if node.domain and node.domain != "ai.onnx":
        imports.append(helper.make_opsetid(node.domain, 1))
    return helper.make_model(graph, opset_imports=imports)
