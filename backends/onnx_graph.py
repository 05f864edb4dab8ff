"""Reading ONNX models: load with a clear error, and tensor specs of graph I/O.

Shared by every ONNX-consuming backend and by the runtime; ``onnx`` is
imported lazily because importing it costs ~0.75 s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from backends.base import Dim, ModelSource, TensorSpec
from backends.errors import ModelLoadError, ModelNotFoundError

if TYPE_CHECKING:
    import onnx


# Exporters write these for "unknown"; they name no dimension shared between tensors. paddle2onnx,
# tf2onnx and older exporters also store dynamic dims as ``dim_value`` -1 or 0, read as unknown too.
_ANONYMOUS_DIMS = frozenset({"", "?", "-1", "None", "unk"})


def load_onnx(source: ModelSource) -> "onnx.ModelProto":
    """Return the model as a ModelProto; a path is read and checked.

    Raises ModelNotFoundError for a missing file and ModelLoadError naming the
    path and the cause for an unreadable or corrupt one.
    """
    import onnx

    if isinstance(source, onnx.ModelProto):
        return source
    path = Path(os.fspath(source))
    if not path.is_file():
        raise ModelNotFoundError(f"model file not found: {path}")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # protobuf raises DecodeError, RuntimeError, ...
        raise ModelLoadError(f"cannot parse ONNX model {path}: {exc}") from exc
    if not model.graph.node and not model.graph.output:
        raise ModelLoadError(f"cannot parse ONNX model {path}: empty graph")
    return model


def numpy_dtype_name(elem_type: int) -> str:
    """numpy dtype name of an ONNX TensorProto element type (``"float32"``)."""
    import onnx

    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, TypeError, ValueError):
        return f"onnx:{onnx.TensorProto.DataType.Name(elem_type)}"


def value_info_spec(value_info: "onnx.ValueInfoProto") -> TensorSpec:
    tensor_type = value_info.type.tensor_type
    dims: list[Dim] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value") and dim.dim_value > 0:
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param") and dim.dim_param not in _ANONYMOUS_DIMS:
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return TensorSpec(value_info.name, numpy_dtype_name(tensor_type.elem_type), tuple(dims))


def graph_inputs(model: "onnx.ModelProto") -> list[TensorSpec]:
    """Real inputs: graph inputs that are not also initializers (old exporters list both)."""
    initializers = {init.name for init in model.graph.initializer}
    return [value_info_spec(vi) for vi in model.graph.input if vi.name not in initializers]


def graph_outputs(model: "onnx.ModelProto") -> list[TensorSpec]:
    return [value_info_spec(vi) for vi in model.graph.output]


def node_label(node: "onnx.NodeProto", index: int) -> str:
    """``"name (OpType)"`` for error messages; an unnamed node is called by its graph index."""
    return f"{node.name or f'#{index}'} ({node.op_type})"


def op_names(nodes: Iterable["onnx.NodeProto"]) -> list[str]:
    """Labels (see ``node_label``) of a whole node list, indexed in that list."""
    return [node_label(node, i) for i, node in enumerate(nodes)]


def tensor_specs(model: "onnx.ModelProto") -> dict[str, TensorSpec]:
    """Specs of every tensor whose type onnx shape inference can tell (inputs, values, outputs).

    Initializers are included with their exact shapes. Inference failures
    (custom domains, exotic exporters) leave those tensors out instead of raising.
    """
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # onnx raises InferenceError/ValidationError/RuntimeError variants
        inferred = model
    graph = inferred.graph
    specs: dict[str, TensorSpec] = {}
    for value_info in (*graph.input, *graph.value_info, *graph.output):
        if value_info.type.HasField("tensor_type"):
            specs[value_info.name] = value_info_spec(value_info)
    for init in model.graph.initializer:
        specs[init.name] = TensorSpec(init.name, numpy_dtype_name(init.data_type), tuple(int(d) for d in init.dims))
    return specs
