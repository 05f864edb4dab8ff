"""The wire codec against tritonclient's own encoder and decoder (the reference client)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as triton

from edge_runtime.errors import InvalidInputError
from edge_runtime.protocol import codec
from server_fixtures import WIRE, triton_inputs, type_feeds


def as_bytes(array: np.ndarray) -> np.ndarray:
    """BYTES as bytes (tritonclient gives str from JSON, bytes from binary data)."""
    if array.dtype != object:
        return array
    return np.vectorize(lambda s: s.encode() if isinstance(s, str) else s, otypes=[object])(array)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_decode_matches_what_tritonclient_encoded_for_every_datatype(binary: bool) -> None:
    arrays = type_feeds(seed=1)
    body, header_length = triton.InferenceServerClient.generate_request_body(
        triton_inputs(arrays, binary), request_id="r-7", priority=2, timeout=1500)
    request = codec.decode_request(body, header_length)
    assert request.id == "r-7"
    assert codec.schedule_parameters(request.parameters, default_priority_level=5) == (-2, 1.5)
    for name, array in arrays.items():
        got = request.inputs[name]
        assert request.datatypes[name] == WIRE[array.dtype.name]
        assert got.shape == array.shape and got.dtype == (object if array.dtype == object else array.dtype)
        np.testing.assert_array_equal(got, as_bytes(array))


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_encoded_response_reads_back_in_tritonclient(binary: bool) -> None:
    arrays = type_feeds(seed=2)
    request = codec.InferRequest({}, {}, parameters={"binary_data_output": binary}, id="abc")
    encoded = codec.encode_response("types", "3", request, arrays, {"plan": "cpu"})
    assert (encoded.header_length is not None) == binary
    result = triton.InferenceServerClient.parse_response_body(encoded.body, header_length=encoded.header_length)
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == ("types", "3", "abc")
    for name, array in arrays.items():
        np.testing.assert_array_equal(as_bytes(result.as_numpy(name)), as_bytes(array))


def test_requested_outputs_choose_names_order_and_binary_per_output() -> None:
    outputs = {"a": np.arange(3, dtype=np.int32), "b": np.ones((2, 2), np.float32), "c": np.zeros(1, np.int8)}
    request = codec.InferRequest({}, {}, outputs=(codec.RequestedOutput("b", True), codec.RequestedOutput("a")))
    encoded = codec.encode_response("m", "1", request, outputs)
    header = json.loads(encoded.body[:encoded.header_length])
    assert [o["name"] for o in header["outputs"]] == ["b", "a"]
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 16}
    assert header["outputs"][1]["data"] == [0, 1, 2]
    with pytest.raises(InvalidInputError, match=r"unknown output\(s\) \['zz'\]"):
        codec.encode_response("m", "1", codec.InferRequest({}, {}, outputs=(codec.RequestedOutput("zz"),)), outputs)


def test_client_side_encoder_round_trips_through_the_decoder() -> None:
    arrays = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "s": np.array([b"hi", b""], dtype=object)}
    for binary in (False, True):
        encoded = codec.encode_request(arrays, binary=binary, parameters={"priority": 1})
        request = codec.decode_request(encoded.body, encoded.header_length)
        np.testing.assert_array_equal(request.inputs["x"], arrays["x"])
        np.testing.assert_array_equal(request.inputs["s"], arrays["s"])


def body(inputs: list[dict], **extra: object) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


def fp32(name: str = "x", shape: list[int] | None = None, data: object = None, datatype: str = "FP32") -> dict:
    return {"name": name, "datatype": datatype, "shape": shape or [2], "data": [1.0, 2.0] if data is None else data}


@pytest.mark.parametrize("raw, header_length, message", [
    (b"{not json", None, "malformed JSON"),
    (b"[1, 2]", None, "must be a JSON object"),
    (body([]), None, "non-empty 'inputs'"),
    (body([fp32(datatype="FLOAT")]), None, "unknown datatype 'FLOAT'"),
    (body([fp32(shape=[3])]), None, r"shape \[3\] needs 3 elements, 'data' has 2"),
    (body([fp32(shape=[-1])]), None, "list of integers >= 0"),
    (body([fp32(data=[[1.0], [2.0, 3.0]])]), None, "ragged"),
    (body([fp32(data=["a", "b"])]), None, "FP32 needs numbers in 'data', got strings"),
    (body([fp32(datatype="INT32", data=[1.5, 2.0])]), None, "INT32 needs integers in 'data', got floats"),
    (body([fp32(datatype="INT8", data=[1, 300])]), None, "value 300 is out of range for INT8"),
    (body([fp32(datatype="BOOL", data=[1, 0])]), None, "BOOL needs true/false"),
    (body([fp32(datatype="BYTES", data=[1, 2])]), None, "BYTES needs strings"),
    (body([fp32(), fp32()]), None, "appears twice"),
    (body([{"name": "x", "datatype": "FP32", "shape": [2]}]), None, "neither 'data' nor"),
    (body([{"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}]), None,
     "no Inference-Header-Content-Length"),
    (body([fp32()], outputs=[{"name": "y", "parameters": {"binary_data": "yes"}}]), None, "binary_data must be"),
    (body([fp32()], id=5), None, "'id' must be a string"),
])
def test_malformed_requests_name_the_problem(raw: bytes, header_length: int | None, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        codec.decode_request(raw, header_length)


def binary_body(declared: int, actual: bytes, shape: list[int], datatype: str = "FP32") -> tuple[bytes, int]:
    head = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": shape,
                                   "parameters": {"binary_data_size": declared}}]}).encode()
    return head + actual, len(head)


@pytest.mark.parametrize("declared, actual, shape, datatype, message", [
    (16, b"\0" * 8, [4], "FP32", "runs past the body"),
    (8, b"\0" * 12, [2], "FP32", "declare 8 bytes, the body carries 12"),
    (8, b"\0" * 8, [4], "FP32", r"shape \[4\] of FP32 needs 16 bytes, binary_data_size is 8"),
    (2, b"\x01\x02", [2], "BOOL", "BOOL bytes must be 0 or 1"),
    (6, b"\x05\0\0\0ab", [1], "BYTES", "claims 5 bytes, 2 are left"),
    (3, b"\x01\0\0", [1], "BYTES", "inside a 4-byte length prefix"),
    (10, b"\x01\0\0\0a\x01\0\0\0b", [3], "BYTES", "needs 3 BYTES elements, the data holds 2"),
])
def test_bad_binary_lengths_are_named(declared: int, actual: bytes, shape: list[int], datatype: str,
                                      message: str) -> None:
    raw, header_length = binary_body(declared, actual, shape, datatype)
    with pytest.raises(InvalidInputError, match=message):
        codec.decode_request(raw, header_length)


def test_header_length_past_the_body_is_rejected() -> None:
    with pytest.raises(InvalidInputError, match="Inference-Header-Content-Length is 99, the body has 2 bytes"):
        codec.decode_request(b"{}", 99)


@pytest.mark.parametrize("parameters, expected", [
    ({}, (-5, None)), ({"priority": 0}, (-5, None)), ({"priority": 1}, (-1, None)),
    ({"priority": 9, "timeout": 250}, (-9, 0.25)), ({"timeout": 0}, (-5, None)),
])
def test_priority_and_timeout_follow_triton_semantics(parameters: dict, expected: tuple) -> None:
    assert codec.schedule_parameters(parameters, default_priority_level=5) == expected


@pytest.mark.parametrize("parameters, message", [
    ({"priority": -1}, "priority must be an integer >= 0"),
    ({"priority": "high"}, "priority must be an integer >= 0"),
    ({"timeout": -5}, "timeout must be microseconds >= 0"),
])
def test_bad_schedule_parameters(parameters: dict, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        codec.schedule_parameters(parameters, default_priority_level=5)
