"""Property tests of the gRPC inference codec (``edge_runtime.protocol.grpc_codec``) under hostile messages.

The contract: ``decode_infer_request`` either returns arrays that agree with what the message
declared, or raises ``InvalidInputError`` with a message — never another exception type, whatever
the fields hold (bogus datatypes, extreme or negative shapes, contents of the wrong kind or count,
raw entries that lie, parameters of any type). The positive oracle is the reference client's
serialisation (``tritonclient.utils.serialize_byte_tensor``, numpy's little-endian bytes) and the
protobuf messages themselves, not our own encoder.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from edge_runtime.errors import InvalidInputError
from edge_runtime.protocol.grpc_codec import (
    CONTENTS_FIELD,
    decode_infer_request,
    encode_infer_response,
    set_parameters,
)
from edge_runtime.protocol.tensors import DATATYPES

NUMERIC = sorted(t for t in DATATYPES if t != "BYTES")
INT64 = st.integers(-2**63, 2**63 - 1)
DIMS = st.one_of(st.integers(0, 4), st.sampled_from([2**31, 2**32, 2**62, 2**63 - 1]), st.integers(-3, -1))
SHAPES = st.one_of(st.lists(st.integers(0, 3), max_size=6), st.lists(DIMS, max_size=70))
CONTENT_VALUES = {
    "bool_contents": st.lists(st.booleans(), max_size=12),
    "int_contents": st.lists(st.integers(-2**31, 2**31 - 1), max_size=12),
    "int64_contents": st.lists(INT64, max_size=12),
    "uint_contents": st.lists(st.integers(0, 2**32 - 1), max_size=12),
    "uint64_contents": st.lists(st.integers(0, 2**64 - 1), max_size=12),
    "fp32_contents": st.lists(st.floats(width=32, allow_nan=True), max_size=12),
    "fp64_contents": st.lists(st.floats(allow_nan=True), max_size=12),
    "bytes_contents": st.lists(st.binary(max_size=6), max_size=12),
}
PARAMETER = st.one_of(st.booleans(), INT64, st.text(max_size=6), st.floats(allow_nan=True))


@st.composite
def requests(draw: st.DrawFn) -> Any:
    message = service_pb2.ModelInferRequest(model_name="m", id=draw(st.text(max_size=4)))
    for _ in range(draw(st.integers(0, 3))):
        tensor = message.inputs.add(name=draw(st.sampled_from(["x", "y", "", "x"])),
                                    datatype=draw(st.one_of(st.sampled_from(sorted(DATATYPES)), st.text(max_size=5))),
                                    shape=draw(SHAPES))
        if draw(st.booleans()):
            field = draw(st.sampled_from(sorted(CONTENT_VALUES)))
            getattr(tensor.contents, field).extend(draw(CONTENT_VALUES[field]))
        for key in draw(st.lists(st.sampled_from(["shared_memory_region", "shared_memory_byte_size", "other"]),
                                 max_size=2)):
            set_parameters(tensor.parameters, {key: draw(PARAMETER)})
    for raw in draw(st.lists(st.binary(max_size=40), max_size=3)):
        message.raw_input_contents.append(raw)
    for name in draw(st.lists(st.text(max_size=3), max_size=2)):
        output = message.outputs.add(name=name)
        if draw(st.booleans()):
            key = draw(st.sampled_from(["classification", "shared_memory_region", "binary_data"]))
            set_parameters(output.parameters, {key: draw(PARAMETER)})
    for key in draw(st.lists(st.sampled_from(["priority", "timeout", "async", "x"]), max_size=3)):
        set_parameters(message.parameters, {key: draw(PARAMETER)})
    return message


def decode(message: Any) -> Any:
    """decode_infer_request, asserting the one allowed failure: InvalidInputError with a message."""
    try:
        request = decode_infer_request(message)
    except InvalidInputError as exc:
        assert str(exc).strip(), "an error without a message"
        return None
    for tensor in message.inputs:
        array = request.inputs[tensor.name]
        assert isinstance(array, np.ndarray) and list(array.shape) == list(tensor.shape)
    return request


@given(requests())
def test_any_message_decodes_or_is_a_clean_invalid_input_error(message: Any) -> None:
    decode(message)


@given(st.binary(max_size=200))
def test_arbitrary_wire_bytes_that_parse_decode_cleanly(data: bytes) -> None:
    from google.protobuf.message import DecodeError

    try:
        message = service_pb2.ModelInferRequest.FromString(data)  # what grpc hands the servicer
    except DecodeError:
        return
    decode(message)


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
@given(data=st.data())
def test_raw_and_typed_contents_round_trip_every_datatype(datatype: str, data: st.DataObject) -> None:
    shape = data.draw(st.lists(st.integers(0, 3), max_size=3))
    if datatype == "BYTES":
        flat = data.draw(st.lists(st.binary(max_size=5), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
        array = np.array(flat + [b""], dtype=object)[:-1].reshape(shape)  # a 1-D object array of bytes
        serialized = serialize_byte_tensor(array)  # as tritonclient.grpc's InferInput fills raw contents
        raw = serialized.item() if serialized.size else b""
    else:
        array = data.draw(hnp.arrays(np.dtype(DATATYPES[datatype]), shape))
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
    message = service_pb2.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype=datatype, shape=shape)
    message.raw_input_contents.append(raw)
    got = decode(message).inputs["x"]
    assert got.shape == array.shape and (got == array)[~_nan(array)].all()
    if datatype in CONTENTS_FIELD:  # FP16 has no typed field
        typed = service_pb2.ModelInferRequest(model_name="m")
        tensor = typed.inputs.add(name="x", datatype=datatype, shape=shape)
        getattr(tensor.contents, CONTENTS_FIELD[datatype]).extend(array.ravel().tolist())
        again = decode(typed).inputs["x"]
        assert again.dtype == got.dtype and again.shape == got.shape and (again == got)[~_nan(array)].all()


def _nan(array: np.ndarray) -> np.ndarray:
    return np.isnan(array) if array.dtype.kind == "f" else np.zeros(array.shape, bool)


@given(hnp.arrays(st.sampled_from([np.float32, np.int64, np.uint8, np.bool_]), hnp.array_shapes(max_dims=3)))
def test_responses_carry_each_output_as_its_raw_bytes(array: np.ndarray) -> None:
    request = decode(service_pb2.ModelInferRequest(model_name="m", inputs=[
        service_pb2.ModelInferRequest.InferInputTensor(name="x", datatype="INT32", shape=[1],
                                                       contents=service_pb2.InferTensorContents(int_contents=[1]))]))
    response = encode_infer_response(service_pb2.ModelInferResponse(), "m", "1", request, {"y": array},
                                     {"plan": "cpu", "batch_size": 1, "retried": False})
    assert [o.name for o in response.outputs] == ["y"] and list(response.outputs[0].shape) == list(array.shape)
    got = np.frombuffer(response.raw_output_contents[0], array.dtype.newbyteorder("<")).reshape(array.shape)
    np.testing.assert_array_equal(got, array)
    assert response.parameters["retried"].bool_param is False and response.parameters["batch_size"].int64_param == 1
