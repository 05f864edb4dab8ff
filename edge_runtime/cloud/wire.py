"""Client side of the KServe v2 wire format: decoding an inference *response*.

Requests are encoded with the server's codec (``edge_runtime.protocol.codec.encode_request``);
the codec decodes requests only, so the response half lives here. A response is
a JSON header (``outputs``: name, datatype, shape, then ``data`` or
``parameters.binary_data_size``), optionally followed by binary tensor bytes
in the order of ``outputs``; the header's length comes in the
``Inference-Header-Content-Length`` HTTP header.

Every malformation raises ``CloudResponseError`` naming the model and tensor:
a peer that answers nonsense has failed, like one that did not answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from edge_runtime.errors import CloudError, InvalidInputError


class CloudResponseError(CloudError):
    """The cloud peer's response could not be decoded (wrong JSON, sizes, datatypes)."""


@dataclass(frozen=True)
class DecodedResponse:
    outputs: dict[str, np.ndarray]
    parameters: Mapping[str, Any] = field(default_factory=dict)
    model_name: str = ""


def decode_response(body: bytes, header_length: int | None, model: str) -> DecodedResponse:
    """Outputs (numpy, native byte order) and response parameters; raises CloudResponseError."""
    from edge_runtime.protocol.codec import DATATYPES, from_bytes, from_json

    where = f"cloud response of model {model!r}"
    if header_length is None:
        head, binary = body, b""
    elif 0 <= header_length <= len(body):
        head, binary = body[:header_length], body[header_length:]
    else:
        raise CloudResponseError(f"{where}: Inference-Header-Content-Length {header_length} "
                                 f"does not fit a body of {len(body)} bytes")
    try:
        header = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CloudResponseError(f"{where}: malformed JSON ({exc})") from None
    items = header.get("outputs") if isinstance(header, dict) else None
    if not isinstance(items, list):
        raise CloudResponseError(f"{where}: no 'outputs' list")
    outputs: dict[str, np.ndarray] = {}
    view = memoryview(binary)
    offset = 0
    for index, item in enumerate(items):
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str):
            raise CloudResponseError(f"{where}: outputs[{index}] has no name")
        datatype, shape = item.get("datatype"), item.get("shape")
        if datatype not in DATATYPES or not isinstance(shape, list):
            raise CloudResponseError(f"{where}: output {name!r} has datatype {datatype!r}, shape {shape!r}")
        params = item.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        try:
            if size is not None:
                if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                    raise CloudResponseError(f"{where}: output {name!r} binary_data_size {size!r} runs past "
                                             f"the {len(binary) - offset} binary bytes left")
                array = from_bytes(name, datatype, tuple(shape), view[offset:offset + size])
                offset += size
            elif "data" in item:
                array = from_json(name, datatype, tuple(shape), item["data"])
            else:
                raise CloudResponseError(f"{where}: output {name!r} has neither data nor binary_data_size")
        except InvalidInputError as exc:  # the codec words it for requests; here the peer is at fault
            raise CloudResponseError(f"{where}: {exc}") from None
        # NOTE: binary tensors are views of the body; copy so callers own writable arrays.
        outputs[name] = np.array(array)
    parameters = header.get("parameters") or {}
    return DecodedResponse(outputs, parameters if isinstance(parameters, dict) else {},
                           str(header.get("model_name", "")))


def server_compute_ms(parameters: Mapping[str, Any]) -> float | None:
    """The peer's own compute time, where it reports one (edge-runtime's ``compute_us``; others: None)."""
    value = parameters.get("compute_us")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value) / 1e3
    return None
