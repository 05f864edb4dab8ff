"""KServe v2 / Open Inference Protocol requests and responses <-> numpy: pure functions, no HTTP.

A request body is a JSON header, optionally followed by raw tensor bytes (the
binary tensor data extension): the header's length then comes separately (the
``Inference-Header-Content-Length`` HTTP header) and each binary input says its
``parameters.binary_data_size``; the bytes follow in the order of ``inputs``
(tensor encodings: ``tensors.py``). Responses mirror this for outputs.

Every mistake raises ``InvalidInputError`` naming the tensor and what was
expected versus received.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from backends.base import TensorSpec
from edge_runtime.errors import InvalidInputError
from edge_runtime.protocol import jsonio
from edge_runtime.protocol.tensors import DATATYPES, from_bytes, from_json, to_bytes, to_json, wire_datatype, wire_shape

__all__ = ["DATATYPES", "EncodedResponse", "InferRequest", "RequestedOutput", "check_outputs", "decode_request",
           "encode_request", "encode_response", "feeds_for", "parse_json", "schedule_parameters", "wire_datatype",
           "wire_shape"]


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: the request-level default
    shared_memory: tuple[Any, Any, Any] | None = None  # (region, offset, byte_size): written there, not sent


class RegionViews(Protocol):
    """Where shared-memory tensors live (``edge_runtime.serving.shared_memory.RegionLease``)."""

    def view(self, region_name: Any, offset: Any, byte_size: Any, tensor: str) -> memoryview:
        ...


@dataclass(frozen=True)
class InferRequest:
    """A decoded request: arrays already shaped; ``outputs`` empty means "all"."""

    inputs: dict[str, np.ndarray]
    datatypes: dict[str, str]
    outputs: tuple[RequestedOutput, ...] = ()
    id: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EncodedResponse:
    """Bytes to send; ``header_length`` is set when binary tensors follow the JSON header."""

    body: bytes
    header_length: int | None = None

    @property
    def content_type(self) -> str:
        return "application/json" if self.header_length is None else "application/octet-stream"


# -- requests -----------------------------------------------------------------------------
def decode_request(body: bytes, header_length: int | None, regions: RegionViews | None = None) -> InferRequest:
    """Parse an inference request body; raises InvalidInputError on any malformation.

    An input naming ``parameters.shared_memory_region`` is a view of that region
    (through ``regions``; without them such an input is an error).
    """
    header, binary = _split(body, header_length)
    if not isinstance(header, dict):
        raise InvalidInputError(f"the request must be a JSON object, got {type(header).__name__}")
    inputs_json = header.get("inputs")
    if not isinstance(inputs_json, list) or not inputs_json:
        raise InvalidInputError("the request needs a non-empty 'inputs' list")
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInputError(f"'id' must be a string, got {request_id!r}")
    parameters = header.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInputError("'parameters' must be a JSON object")
    arrays: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    view = memoryview(binary)  # slices of a view share the body instead of copying it
    offset = 0
    for index, item in enumerate(inputs_json):
        name, datatype, shape, params = _tensor_header(item, f"inputs[{index}]")
        if name in arrays:
            raise InvalidInputError(f"input {name!r} appears twice in the request")
        size = params.get("binary_data_size")
        if "shared_memory_region" in params:
            if regions is None:
                raise InvalidInputError(f"input {name!r}: shared memory is not available on this transport")
            region = params["shared_memory_region"]
            view = regions.view(region, params.get("shared_memory_offset", 0),
                                params.get("shared_memory_byte_size"), name)
            try:
                arrays[name] = from_bytes(name, datatype, shape, view)
            except InvalidInputError as exc:
                raise InvalidInputError(f"{exc} (from shared memory region {region!r})") from None
        elif size is not None:
            if header_length is None:
                raise InvalidInputError(f"input {name!r} has binary_data_size but the request has no "
                                        "Inference-Header-Content-Length header")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidInputError(f"input {name!r}: binary_data_size must be an integer >= 0, got {size!r}")
            if offset + size > len(binary):
                raise InvalidInputError(
                    f"input {name!r}: binary_data_size {size} runs past the body "
                    f"({len(binary) - offset} binary bytes left)")
            arrays[name] = from_bytes(name, datatype, shape, view[offset:offset + size])
            offset += size
        elif "data" in item:
            arrays[name] = from_json(name, datatype, shape, item["data"])
        else:
            raise InvalidInputError(f"input {name!r} has neither 'data' nor parameters.binary_data_size")
        datatypes[name] = datatype
    if offset != len(binary):
        raise InvalidInputError(
            f"binary data: the inputs declare {offset} bytes, the body carries {len(binary)} after the header")
    return InferRequest(arrays, datatypes, _requested_outputs(header.get("outputs")), request_id, parameters)


def _split(body: bytes, header_length: int | None) -> tuple[Any, bytes | memoryview]:
    if header_length is None:
        header_bytes, binary = body, b""
    else:
        if header_length < 0 or header_length > len(body):
            raise InvalidInputError(
                f"Inference-Header-Content-Length is {header_length}, the body has {len(body)} bytes")
        # A view, not a slice: a slice of bytes copies the (megabytes of) tensor data after the header.
        whole = memoryview(body)
        header_bytes, binary = whole[:header_length], whole[header_length:]
    return parse_json(header_bytes), binary


def parse_json(raw: bytes | memoryview) -> Any:
    """A JSON document from request bytes; InvalidInputError when malformed or nested too deep."""
    try:
        return jsonio.loads(raw)
    except (UnicodeDecodeError, jsonio.DecodeError) as exc:
        raise InvalidInputError(f"malformed JSON in the request: {exc}") from None
    except RecursionError:  # the stdlib parser recurses per nesting level
        raise InvalidInputError("malformed JSON in the request: nested too deeply") from None


def _tensor_header(item: Any, where: str) -> tuple[str, str, tuple[int, ...], dict[str, Any]]:
    if not isinstance(item, dict):
        raise InvalidInputError(f"{where} must be a JSON object")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInputError(f"{where} needs a 'name' string")
    datatype = item.get("datatype")
    if datatype not in DATATYPES:
        raise InvalidInputError(f"input {name!r}: unknown datatype {datatype!r}; known: {sorted(DATATYPES)}")
    shape = item.get("shape")
    if (not isinstance(shape, list)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise InvalidInputError(f"input {name!r}: 'shape' must be a list of integers >= 0, got {shape!r}")
    params = item.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidInputError(f"input {name!r}: 'parameters' must be a JSON object")
    return name, datatype, tuple(shape), params


def _requested_outputs(outputs: Any) -> tuple[RequestedOutput, ...]:
    if outputs is None:
        return ()
    if not isinstance(outputs, list):
        raise InvalidInputError("'outputs' must be a list")
    requested = []
    for index, item in enumerate(outputs):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidInputError(f"outputs[{index}] must be an object with a 'name' string")
        params = item.get("parameters") or {}
        binary = params.get("binary_data") if isinstance(params, dict) else None
        if binary is not None and not isinstance(binary, bool):
            raise InvalidInputError(f"output {item['name']!r}: parameters.binary_data must be true or false")
        shared = None
        if isinstance(params, dict) and "shared_memory_region" in params:
            shared = (params["shared_memory_region"], params.get("shared_memory_offset", 0),
                      params.get("shared_memory_byte_size"))
        requested.append(RequestedOutput(item["name"], binary, shared))
    return tuple(requested)


def feeds_for(request: InferRequest, specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """The request's arrays as model feeds; each wire datatype must be the model's.

    Names and shapes are checked later by the scheduler (``validate_feeds``);
    here only what the wire adds: datatype agreement, and text for string inputs.
    """
    by_name = {spec.name: spec for spec in specs}
    feeds = {}
    for name, array in request.inputs.items():
        spec = by_name.get(name)
        if spec is None:
            raise InvalidInputError(f"unknown input {name!r}; the model's inputs are {sorted(by_name)}")
        expected = wire_datatype(spec.dtype)
        if request.datatypes[name] != expected:
            raise InvalidInputError(
                f"input {name!r}: the model expects datatype {expected}, the request sent {request.datatypes[name]}")
        feeds[name] = _as_text(name, array) if expected == "BYTES" else array
    return feeds


def _as_text(name: str, array: np.ndarray) -> np.ndarray:
    # NOTE: ONNX Runtime turns a bytes element into its repr ("b'..'"); string inputs need str.
    text = np.empty(array.shape, dtype=object)
    try:
        text.flat[:] = [b.decode() if isinstance(b, bytes) else b for b in array.flat]
    except UnicodeDecodeError:
        raise InvalidInputError(f"input {name!r}: BYTES for an ONNX string input must be UTF-8 text") from None
    return text


def schedule_parameters(parameters: Mapping[str, Any], default_priority_level: int) -> tuple[int, float | None]:
    """``(scheduler priority, timeout_ms)`` from Triton's ``priority`` and ``timeout`` parameters.

    Triton semantics: ``priority`` 1 is the most urgent level and larger numbers
    are less urgent; 0 or absent means ``default_priority_level``. The scheduler
    serves higher values first, so the level is negated. ``timeout`` is in
    microseconds; 0 or absent means the model's default.
    """
    level = parameters.get("priority", 0)
    if not isinstance(level, int) or isinstance(level, bool) or level < 0:
        raise InvalidInputError(f"parameters.priority must be an integer >= 0, got {level!r}")
    timeout_us = parameters.get("timeout", 0)
    if (not isinstance(timeout_us, (int, float)) or isinstance(timeout_us, bool) or not timeout_us >= 0
            or timeout_us == math.inf):  # NOTE: "not >= 0" also refuses NaN
        raise InvalidInputError(f"parameters.timeout must be microseconds >= 0, got {timeout_us!r}")
    return -(level or default_priority_level), (timeout_us / 1000.0 if timeout_us else None)


# -- responses ----------------------------------------------------------------------------
def check_outputs(request: InferRequest, output_names: Sequence[str]) -> None:
    """InvalidInputError when the request names an output the model does not have, or one twice."""
    requested = [o.name for o in request.outputs]
    unknown = [name for name in requested if name not in output_names]
    if unknown:
        raise InvalidInputError(f"unknown output(s) {unknown}; the model's outputs are {sorted(output_names)}")
    if len(set(requested)) != len(requested):
        raise InvalidInputError(f"an output is requested twice: {requested}")


def encode_response(model_name: str, model_version: str, request: InferRequest,
                    outputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any] | None = None,
                    regions: RegionViews | None = None) -> EncodedResponse:
    """Serialise the requested outputs (all when none were named), JSON or binary per output; an output
    requested into shared memory is written there (through ``regions``) and described, not sent."""
    default_binary = request.parameters.get("binary_data_output", False) is True
    if request.outputs:
        check_outputs(request, list(outputs))
        chosen = [(o.name, default_binary if o.binary is None else o.binary) for o in request.outputs
                  if o.shared_memory is None]
    else:
        chosen = [(name, default_binary) for name in outputs]
    header: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    shared = [to_region(o.name, np.asarray(outputs[o.name]), o.shared_memory, regions)
              for o in request.outputs if o.shared_memory is not None]
    return _pack(header, "outputs", [(name, np.asarray(outputs[name]), binary) for name, binary in chosen],
                 request.id, parameters, shared)


def to_region(name: str, array: np.ndarray, where: tuple[Any, Any, Any],
               regions: RegionViews | None) -> dict[str, Any]:
    """Write ``array``'s binary tensor data into its region; the response entry that says so."""
    if regions is None:
        raise InvalidInputError(f"output {name!r}: shared memory is not available on this transport")
    region, offset, byte_size = where
    target = regions.view(region, offset, byte_size, name)
    if wire_datatype(array.dtype) == "BYTES":
        raw: Any = to_bytes(array)
    else:  # little-endian, contiguous: a view of the output when it already is (no extra copy)
        raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).reshape(-1).view(np.uint8)
    if len(raw) > len(target):
        raise InvalidInputError(f"output {name!r} needs {len(raw)} bytes; shared memory region {region!r} "
                                f"gives it shared_memory_byte_size {len(target)}")
    target[:len(raw)] = raw if isinstance(raw, bytes) else raw.data
    return {"name": name, "datatype": wire_datatype(array.dtype), "shape": list(array.shape),
            "parameters": {"shared_memory_region": region, "shared_memory_byte_size": len(raw)}}


# -- the client side (load generator, benchmarks) ----------------------------------------------
def encode_request(inputs: Mapping[str, np.ndarray], *, binary: bool = False, request_id: str | None = None,
                   parameters: Mapping[str, Any] | None = None) -> EncodedResponse:
    """A request body for ``inputs`` (JSON data, or binary tensor data when ``binary``)."""
    return _pack({}, "inputs", [(name, array, binary) for name, array in inputs.items()], request_id, parameters)


def _pack(header: dict[str, Any], key: str, tensors: list[tuple[str, np.ndarray, bool]], request_id: str | None,
          parameters: Mapping[str, Any] | None, described: Sequence[dict[str, Any]] = ()) -> EncodedResponse:
    """The JSON header with ``tensors`` (then ``described`` entries) under ``key``, then the binary chunks."""
    entries: list[dict[str, Any]] = []
    chunks = []
    for name, array, binary in tensors:
        entry: dict[str, Any] = {"name": name, "datatype": wire_datatype(array.dtype), "shape": list(array.shape)}
        if binary:
            raw = to_bytes(array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = to_json(name, array)
        entries.append(entry)
    entries.extend(described)
    if request_id is not None:
        header["id"] = request_id
    if parameters:
        header["parameters"] = dict(parameters)
    header[key] = entries
    head = jsonio.dumps(header)
    if not chunks:
        return EncodedResponse(head)
    return EncodedResponse(b"".join([head, *chunks]), len(head))
