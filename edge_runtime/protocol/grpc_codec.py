"""KServe v2 gRPC inference messages <-> the codec's ``InferRequest`` and numpy outputs: pure functions.

The messages are those of the ``inference.GRPCInferenceService`` protocol (the KServe v2 / Open
Inference Protocol gRPC API with Triton's extensions), as ``tritonclient.grpc`` generates them; the
caller passes the response class, so nothing here imports grpc.

A ``ModelInferRequest`` carries each input either as typed ``contents`` or as one entry of
``raw_input_contents`` (little-endian bytes, the same layout as HTTP's binary tensor data; FP16
has no typed field), never both in one request; an input with a ``shared_memory_region``
parameter has neither and is read from that region. Responses always carry every output as raw
bytes, one ``raw_output_contents`` entry per output in order (an empty one for an output written
to shared memory), as Triton does. Errors are ``InvalidInputError`` naming the tensor, what was
expected and what was received — the HTTP codec's messages where the rule is the same.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from edge_runtime.errors import InvalidInputError
from edge_runtime.protocol.codec import InferRequest, RegionViews, RequestedOutput, to_region
from edge_runtime.protocol.tensors import DATATYPES, from_bytes, shaped, to_bytes, wire_datatype

# The typed ``InferTensorContents`` field of each datatype (narrower integers travel widened).
CONTENTS_FIELD = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
                  "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
                  "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
                  "FP64": "fp64_contents", "BYTES": "bytes_contents"}
RAW = "raw_input_contents"


def parameter_value(parameter: Any) -> Any:
    """The Python value of an ``InferParameter`` (or ``ModelRepositoryParameter``): whichever it holds."""
    kind = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, kind) if kind is not None else None


def parameters_of(parameters: Mapping[str, Any]) -> dict[str, Any]:
    return {key: parameter_value(value) for key, value in parameters.items()}


def set_parameters(target: Any, values: Mapping[str, Any]) -> None:
    """Fill a protobuf map of ``InferParameter`` from strings, booleans and integers."""
    for key, value in values.items():
        if isinstance(value, bool):
            target[key].bool_param = value
        elif isinstance(value, int):
            target[key].int64_param = value
        elif isinstance(value, float):
            target[key].double_param = value
        else:
            target[key].string_param = str(value)


def decode_infer_request(message: Any, regions: RegionViews | None = None) -> InferRequest:
    """A ``ModelInferRequest`` as an ``InferRequest``; InvalidInputError for any malformation."""
    if not message.inputs:
        raise InvalidInputError("the request needs at least one input")
    raw = message.raw_input_contents
    arrays: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    used = 0  # raw_input_contents entries taken, in input order
    for index, tensor in enumerate(message.inputs):
        name = tensor.name
        if not name:
            raise InvalidInputError(f"inputs[{index}] needs a name")
        if name in arrays:
            raise InvalidInputError(f"input {name!r} appears twice in the request")
        datatype = tensor.datatype
        if datatype not in DATATYPES:
            raise InvalidInputError(f"input {name!r}: unknown datatype {datatype!r}; known: {sorted(DATATYPES)}")
        shape = tuple(int(d) for d in tensor.shape)
        if any(d < 0 for d in shape):
            raise InvalidInputError(f"input {name!r}: 'shape' must be integers >= 0, got {list(shape)}")
        params = parameters_of(tensor.parameters)
        if "shared_memory_region" in params:
            arrays[name] = _from_region(name, datatype, shape, params, regions)
        elif raw:
            if tensor.HasField("contents"):
                raise InvalidInputError(f"input {name!r} has typed contents but the request uses {RAW}: "
                                        f"give every input one way")
            if used >= len(raw):
                raise InvalidInputError(f"input {name!r}: {RAW} has {len(raw)} entries, too few for the inputs")
            arrays[name] = from_bytes(name, datatype, shape, raw[used], f"its {RAW} entry's size")
            used += 1
        else:
            arrays[name] = _from_contents(name, datatype, shape, tensor.contents)
        datatypes[name] = datatype
    if used != len(raw):
        raise InvalidInputError(f"{RAW} has {len(raw)} entries; the inputs use {used}")
    return InferRequest(arrays, datatypes, tuple(_requested(o) for o in message.outputs), message.id or None,
                        parameters_of(message.parameters))


def _from_region(name: str, datatype: str, shape: tuple[int, ...], params: Mapping[str, Any],
                 regions: RegionViews | None) -> np.ndarray:
    if regions is None:
        raise InvalidInputError(f"input {name!r}: shared memory is not available on this transport")
    region = params["shared_memory_region"]
    view = regions.view(region, params.get("shared_memory_offset", 0), params.get("shared_memory_byte_size"), name)
    try:
        return from_bytes(name, datatype, shape, view, "shared_memory_byte_size")
    except InvalidInputError as exc:
        raise InvalidInputError(f"{exc} (from shared memory region {region!r})") from None


def _from_contents(name: str, datatype: str, shape: tuple[int, ...], contents: Any) -> np.ndarray:
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidInputError(f"input {name!r}: datatype {datatype} has no typed contents: send it in {RAW}")
    values = getattr(contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidInputError(f"input {name!r}: shape {list(shape)} needs {count} elements, "
                                f"contents.{field} has {len(values)}")
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return shaped(name, array, shape)
    dtype = np.dtype(DATATYPES[datatype])
    if dtype.kind in "iu" and values:
        info = np.iinfo(dtype)
        low, high = min(values), max(values)  # Python ints: exact even beyond int64
        if low < info.min or high > info.max:
            raise InvalidInputError(f"input {name!r}: value {low if low < info.min else high} is out of range "
                                    f"for {datatype}")
    return shaped(name, np.array(values, dtype=dtype), shape)


def _requested(output: Any) -> RequestedOutput:
    params = parameters_of(output.parameters)
    if "classification" in params:
        raise InvalidInputError(f"output {output.name!r}: the classification extension is not supported")
    shared = None
    if "shared_memory_region" in params:
        shared = (params["shared_memory_region"], params.get("shared_memory_offset", 0),
                  params.get("shared_memory_byte_size"))
    return RequestedOutput(output.name, None, shared)


def encode_infer_response(response: Any, model_name: str, model_version: str, request: InferRequest,
                          outputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any] | None = None,
                          regions: RegionViews | None = None) -> Any:
    """Fill ``response`` (an empty ``ModelInferResponse``) with the requested outputs (all when none were
    named), each as raw bytes or written to its shared-memory region; returns it."""
    response.model_name, response.model_version = model_name, model_version
    if request.id:
        response.id = request.id
    set_parameters(response.parameters, parameters or {})
    shared = {o.name: o.shared_memory for o in request.outputs if o.shared_memory is not None}
    for name in [o.name for o in request.outputs] or list(outputs):
        array = np.asarray(outputs[name])
        tensor = response.outputs.add()
        tensor.name, tensor.datatype = name, wire_datatype(array.dtype)
        tensor.shape.extend(array.shape)
        if name in shared:
            entry = to_region(name, array, shared[name], regions)
            set_parameters(tensor.parameters, entry["parameters"])
            response.raw_output_contents.append(b"")
        else:
            response.raw_output_contents.append(to_bytes(array))
    return response
