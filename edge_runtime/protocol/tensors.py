"""KServe v2 tensors <-> numpy arrays: datatypes, JSON ``data`` and binary tensor data.

Fixed-size types travel as raw little-endian bytes; ``BYTES`` elements each as a
4-byte little-endian length and that many bytes; ``BOOL`` as one byte (0 or 1).
JSON ``data`` is row-major, flat or nested. Errors are ``InvalidInputError``
naming the tensor, what was expected and what was received.
"""

from __future__ import annotations

import functools
import math
import struct
from typing import Any

import numpy as np

from backends.base import TensorSpec
from edge_runtime.errors import InvalidInputError

# Wire datatype -> numpy dtype name; BYTES is a numpy object array of bytes/str.
DATATYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
    "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "FP32": "float32", "FP64": "float64",
    "BYTES": "object",
}
_BY_NUMPY = {dtype: wire for wire, dtype in DATATYPES.items()}


@functools.lru_cache(maxsize=256)
def wire_datatype(numpy_dtype: str | np.dtype) -> str:
    """The wire datatype of a numpy dtype (``float32`` -> ``FP32``); strings are BYTES.

    Cached: every request asks it a few times for the same few dtypes, and numpy computes
    ``dtype.name`` afresh on each access (7 us a call here, three calls a request).
    Errors are raised again on every call (``lru_cache`` keeps only results)."""
    dtype = np.dtype(numpy_dtype) if not str(numpy_dtype).startswith("onnx:") else None
    if dtype is None:
        raise InvalidInputError(f"dtype {numpy_dtype} has no KServe v2 datatype")
    if dtype.kind in "OSU":
        return "BYTES"
    if dtype.name not in _BY_NUMPY:
        raise InvalidInputError(f"dtype {dtype.name} has no KServe v2 datatype")
    return _BY_NUMPY[dtype.name]


def wire_shape(spec: TensorSpec) -> list[int]:
    """Shape for model metadata: symbolic or unknown dimensions are ``-1`` (Triton's spelling)."""
    return [d if isinstance(d, int) and d >= 0 else -1 for d in spec.shape]


def from_json(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> np.ndarray:
    """A tensor from JSON ``data`` (flat or nested, row-major), checked against datatype and shape."""
    count = math.prod(shape)
    if datatype == "BYTES":
        flat = _leaves(data)
        bad = next((v for v in flat if not isinstance(v, str)), None)
        if bad is not None:
            raise InvalidInputError(f"input {name!r}: datatype BYTES needs strings in 'data', got {bad!r}")
        array = np.empty(len(flat), dtype=object)
        try:
            array[:] = [v.encode() for v in flat]
        except UnicodeEncodeError:  # JSON may escape a lone surrogate ("\\ud800"): it has no UTF-8
            raise InvalidInputError(f"input {name!r}: a BYTES string holds a lone surrogate, not text") from None
    else:
        try:
            array = np.asarray(data)
        except ValueError:
            raise InvalidInputError(f"input {name!r}: 'data' is a ragged nested list") from None
        array = _numeric(name, datatype, array.reshape(-1), data)
    if array.size != count:
        raise InvalidInputError(
            f"input {name!r}: shape {list(shape)} needs {count} elements, 'data' has {array.size}")
    return shaped(name, array, shape)


def shaped(name: str, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``array.reshape(shape)``; a shape numpy cannot hold (rank over its limit, a dimension of
    2**63 or more beside a zero one) is the client's mistake, not the server's."""
    try:
        return array.reshape(shape)
    except (ValueError, OverflowError) as exc:
        raise InvalidInputError(f"input {name!r}: a shape of rank {len(shape)} numpy cannot hold: {exc}") from None


def _numeric(name: str, datatype: str, array: np.ndarray, data: Any) -> np.ndarray:
    dtype = np.dtype(DATATYPES[datatype])
    if array.size == 0:
        return array.astype(dtype)
    if dtype.kind in "iu" and array.dtype.kind in "fO":
        # NOTE: numpy guesses float64 (or object) for ints beyond int64; keep them exact if they are ints.
        leaves = _leaves(data)
        if all(type(v) is int for v in leaves):
            return _checked_ints(name, datatype, dtype, min(leaves), max(leaves), leaves)
    allowed = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}[dtype.kind]
    if array.dtype.kind not in allowed:
        what = {"b": "true/false", "i": "integers", "u": "integers", "f": "numbers"}[dtype.kind]
        raise InvalidInputError(
            f"input {name!r}: datatype {datatype} needs {what} in 'data', got {_kind_name(array)}")
    if dtype.kind in "iu":
        return _checked_ints(name, datatype, dtype, int(array.min()), int(array.max()), array)
    return array.astype(dtype)


def _checked_ints(name: str, datatype: str, dtype: np.dtype, low: int, high: int, values: Any) -> np.ndarray:
    info = np.iinfo(dtype)
    if low < info.min or high > info.max:
        raise InvalidInputError(
            f"input {name!r}: value {low if low < info.min else high} is out of range for {datatype}")
    return np.asarray(values).astype(dtype) if isinstance(values, np.ndarray) else np.array(values, dtype=dtype)


def _kind_name(array: np.ndarray) -> str:
    return {"b": "booleans", "i": "integers", "u": "integers", "f": "floats",
            "U": "strings", "S": "strings"}.get(array.dtype.kind, "mixed values")


def _leaves(data: Any) -> list[Any]:
    """The non-list values of a nested list, row-major."""
    flat: list[Any] = []
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            flat.append(item)
    return flat


def from_bytes(name: str, datatype: str, shape: tuple[int, ...], raw: bytes | memoryview,
               size_name: str = "binary_data_size") -> np.ndarray:
    """A tensor from binary tensor data; the byte count must fit the shape exactly (``size_name``: what
    the transport calls the byte count, for the error)."""
    count = math.prod(shape)
    if datatype == "BYTES":
        elements = _split_bytes(name, raw)
        if len(elements) != count:
            raise InvalidInputError(
                f"input {name!r}: shape {list(shape)} needs {count} BYTES elements, the data holds {len(elements)}")
        array = np.empty(count, dtype=object)
        array[:] = elements
        return shaped(name, array, shape)
    dtype = np.dtype(DATATYPES[datatype]).newbyteorder("<")
    if len(raw) != count * dtype.itemsize:
        raise InvalidInputError(
            f"input {name!r}: shape {list(shape)} of {datatype} needs {count * dtype.itemsize} bytes, "
            f"{size_name} is {len(raw)}")
    if datatype == "BOOL":
        octets = np.frombuffer(raw, dtype=np.uint8)
        if octets.size and int(octets.max()) > 1:
            raise InvalidInputError(f"input {name!r}: BOOL bytes must be 0 or 1, found {int(octets.max())}")
    return shaped(name, np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="), copy=False), shape)


def _split_bytes(name: str, raw: bytes | memoryview) -> list[bytes]:
    elements, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise InvalidInputError(f"input {name!r}: BYTES data ends inside a 4-byte length prefix")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise InvalidInputError(
                f"input {name!r}: a BYTES element claims {length} bytes, {len(raw) - offset} are left")
        elements.append(bytes(raw[offset:offset + length]))
        offset += length
    return elements


def to_json(name: str, array: np.ndarray) -> list[Any]:
    """Row-major flat list for JSON ``data``; BYTES become UTF-8 strings."""
    if wire_datatype(array.dtype) != "BYTES":
        return array.reshape(-1).tolist()
    try:
        return [e.decode() if isinstance(e, bytes) else str(e) for e in array.reshape(-1)]
    except UnicodeDecodeError:
        raise InvalidInputError(f"output {name!r} holds non-UTF-8 bytes; request it with binary_data") from None


def to_bytes(array: np.ndarray) -> bytes:
    """Binary tensor data: little-endian raw bytes, or length-prefixed BYTES elements."""
    if wire_datatype(array.dtype) != "BYTES":
        return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    parts = []
    for element in array.reshape(-1):
        raw = element if isinstance(element, bytes) else str(element).encode()
        parts.append(struct.pack("<I", len(raw)) + raw)
    return b"".join(parts)
