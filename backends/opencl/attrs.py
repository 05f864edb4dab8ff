"""Reading ONNX node attributes as plain Python values."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx


def node_attrs(node: "onnx.NodeProto") -> dict[str, Any]:
    """Attribute name -> value (ints, floats, str, lists, numpy arrays for tensors)."""
    import onnx
    from onnx import numpy_helper

    out: dict[str, Any] = {}
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR:
            out[attr.name] = numpy_helper.to_array(attr.t)
            continue
        value = onnx.helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8", errors="replace") for v in value]
        out[attr.name] = value
    return out


def opset_of(model: "onnx.ModelProto") -> int:
    """The default-domain (ai.onnx) opset version the model imports."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 1
