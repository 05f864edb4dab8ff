"""Property tests of the KServe v2 codec (``edge_runtime.protocol``) under hostile input.

The contract under test: ``decode_request`` either returns arrays that agree with
what the request declared, or raises ``InvalidInputError`` with a message — never
another exception type, whatever the bytes. The positive oracle is the reference
client's encoder (``tritonclient.http``), not our own ``encode_request``.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edge_runtime.errors import InvalidInputError
from edge_runtime.protocol.codec import DATATYPES, decode_request, parse_json, schedule_parameters
from edge_runtime.protocol.tensors import from_bytes
from server_fixtures import WIRE

NUMERIC = sorted(t for t in DATATYPES if t != "BYTES")
# Dimensions a hostile client would try: zero, small, around int32/int64 limits, beyond them.
DIMS = st.one_of(st.integers(0, 4), st.sampled_from([2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 + 1]),
                 st.integers(-3, -1), st.integers(0, 2**80))
SHAPES = st.one_of(st.lists(st.integers(0, 3), max_size=6), st.lists(DIMS, max_size=70),
                   st.integers(0, 80).map(lambda rank: [1] * rank))
JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                        st.text(max_size=8))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                 st.dictionaries(st.text(max_size=4), inner,
                                                                                 max_size=3)), max_leaves=12)


def decode(body: bytes, header_length: int | None) -> Any:
    """decode_request, asserting the one allowed failure: InvalidInputError with a message."""
    try:
        request = decode_request(body, header_length)
    except InvalidInputError as exc:
        assert str(exc).strip(), "an error without a message"
        return None
    for name, array in request.inputs.items():
        assert isinstance(array, np.ndarray), name
    return request


@st.composite
def tensor_items(draw: st.DrawFn) -> dict[str, Any]:
    item: dict[str, Any] = {"name": draw(st.one_of(st.just("x"), st.text(max_size=6), JSON_LEAVES)),
                            "datatype": draw(st.one_of(st.sampled_from(sorted(DATATYPES)), JSON_LEAVES)),
                            "shape": draw(st.one_of(SHAPES, JSON_VALUES))}
    if draw(st.booleans()):
        item["data"] = draw(st.one_of(JSON_VALUES, st.lists(JSON_LEAVES, max_size=8)))
    if draw(st.booleans()):
        item["parameters"] = draw(st.one_of(
            st.fixed_dictionaries({"binary_data_size": st.one_of(st.integers(-5, 2**70), JSON_LEAVES)}),
            JSON_VALUES))
    return item


@st.composite
def hostile_requests(draw: st.DrawFn) -> tuple[bytes, int | None]:
    header: dict[str, Any] = {"inputs": draw(st.one_of(st.lists(tensor_items(), max_size=3), JSON_VALUES))}
    for key in ("id", "parameters", "outputs"):
        if draw(st.booleans()):
            header[key] = draw(JSON_VALUES)
    head = json.dumps(header, allow_nan=True).encode()
    binary = draw(st.binary(max_size=64))
    if not draw(st.booleans()):
        return head + binary, None
    honest = draw(st.booleans())
    header_length = len(head) if honest else draw(st.integers(-4, len(head) + len(binary) + 8))
    return head + binary, header_length


@given(hostile_requests())
def test_any_request_decodes_or_is_a_clean_invalid_input_error(request: tuple[bytes, int | None]) -> None:
    decode(*request)


@given(st.binary(max_size=256), st.one_of(st.none(), st.integers(-2, 300)))
def test_arbitrary_bytes_are_a_clean_error(body: bytes, header_length: int | None) -> None:
    decode(body, header_length)


# Strings as JSON may carry them: any code point, lone surrogates ("\\ud800") included.
ANY_TEXT = st.text(alphabet=st.one_of(st.characters(), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)),
                   max_size=4)


@given(st.sampled_from(sorted(DATATYPES)), SHAPES.filter(lambda s: all(isinstance(d, int) and d >= 0 for d in s)),
       st.booleans(), st.data())
def test_well_formed_requests_with_extreme_shapes(datatype: str, shape: list[int], binary: bool,
                                                   data: st.DataObject) -> None:
    """Everything right but the shape's reach: rank 0..80, zero dims beside 2**63 and more."""
    count = math.prod(shape)
    item: dict[str, Any] = {"name": "x", "datatype": datatype, "shape": shape}
    elements = min(count, 16) if count <= 16 else data.draw(st.integers(0, 16))
    if datatype == "BYTES":
        values = data.draw(st.lists(ANY_TEXT, min_size=elements, max_size=elements))
        raw = b"".join(struct.pack("<I", len(v.encode("utf-8", "surrogatepass"))) + v.encode("utf-8", "surrogatepass")
                       for v in values)
    else:
        dtype = np.dtype(DATATYPES[datatype])
        values = [dtype.type(0).item()] * elements
        raw = np.zeros(elements, dtype=dtype.newbyteorder("<")).tobytes()
    if binary:
        item["parameters"] = {"binary_data_size": len(raw)}
    else:
        item["data"] = values
    head = json.dumps({"inputs": [item]}).encode()
    request = decode(head + raw, len(head)) if binary else decode(head, None)
    if request is not None:
        assert request.inputs["x"].shape == tuple(shape) and request.inputs["x"].size == count


def _triton_body(array: np.ndarray, binary: bool) -> tuple[bytes, int | None]:
    import tritonclient.http as triton

    datatype = WIRE[array.dtype.name]
    item = triton.InferInput("x", list(array.shape), datatype)
    item.set_data_from_numpy(array, binary_data=binary)
    body, json_size = triton.InferenceServerClient.generate_request_body([item])
    return body, json_size if binary else None


def _arrays() -> st.SearchStrategy[np.ndarray]:
    shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)
    numeric = st.sampled_from([np.dtype(DATATYPES[t]) for t in NUMERIC]).flatmap(
        lambda dtype: hnp.arrays(dtype, shapes, elements={"allow_nan": False, "allow_infinity": False}
                                 if dtype.kind == "f" else None))
    text = shapes.flatmap(lambda shape: st.lists(st.binary(max_size=6), min_size=math.prod(shape),
                                                 max_size=math.prod(shape)).map(
        lambda values, shape=shape: np.array(values + [b""], dtype=object)[:-1].reshape(shape)))
    return st.one_of(numeric, text)


@given(_arrays(), st.booleans())
def test_tritonclient_requests_of_every_datatype_round_trip(array: np.ndarray, binary: bool) -> None:
    if array.dtype == object and not binary:
        assume(all(_is_text(v) for v in array.flat))  # JSON carries BYTES as text only
    if array.dtype.kind == "f" and not binary:
        array = array.astype(np.float64).astype(array.dtype)  # tritonclient sends JSON floats via tolist()
    body, header_length = _triton_body(array, binary)
    request = decode(body, header_length)
    assert request is not None, "a request the reference client built was refused"
    got = request.inputs["x"]
    assert got.shape == array.shape and request.datatypes["x"] == WIRE[array.dtype.name]
    if array.dtype == object:
        assert [bytes(v) for v in got.flat] == [bytes(v) for v in array.flat]
    else:
        assert got.dtype == array.dtype
        np.testing.assert_array_equal(got, array)


def _is_text(value: bytes) -> bool:
    try:
        value.decode()
    except UnicodeDecodeError:
        return False
    return True


@given(st.sampled_from(NUMERIC), st.lists(st.integers(0, 2**70), min_size=0, max_size=70),
       st.integers(0, 64), st.integers(-8, 8))
def test_binary_sizes_that_lie_are_refused(datatype: str, shape: list[int], payload: int, lie: int) -> None:
    """binary_data_size and the header length disagreeing with the shape, the body or each other."""
    itemsize = np.dtype(DATATYPES[datatype]).itemsize
    raw = bytes(range(256)) * (1 + payload * itemsize // 256)
    raw = raw[:payload * itemsize]
    if datatype == "BOOL":
        raw = bytes(b % 2 for b in raw)
    size = max(0, len(raw) + lie)
    head = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": shape,
                                   "parameters": {"binary_data_size": size}}]}).encode()
    request = decode(head + raw, len(head))
    holdable = len(shape) <= 32 and math.prod(max(d, 1) for d in shape) < 2**63  # what any numpy can hold
    fits = size == len(raw) and math.prod(shape) * itemsize == len(raw) and holdable
    if request is not None:
        assert size == len(raw) and request.inputs["x"].shape == tuple(shape)
        assert request.inputs["x"].nbytes == len(raw)
    elif fits:
        raise AssertionError(f"a consistent request was refused: shape {shape}, {len(raw)} bytes")


@given(st.lists(st.binary(max_size=5), max_size=6), st.integers(0, 12), st.integers(-3, 3))
def test_bytes_elements_with_lying_length_prefixes(elements: list[bytes], cut: int, claim: int) -> None:
    raw = b"".join(struct.pack("<I", len(e)) + e for e in elements)
    forged = raw[:max(0, len(raw) - cut)] + (struct.pack("<I", max(0, claim + 7)) if claim > 0 else b"")
    try:
        array = from_bytes("x", "BYTES", (len(elements),), forged)
    except InvalidInputError as exc:
        assert "'x'" in str(exc)
        return
    assert list(array.flat) == elements and forged == raw


@pytest.mark.parametrize("opener, closer", [("[", "]"), ('{"a":', "}")])
@pytest.mark.parametrize("depth", [1, 60, 65, 1000, 200_000])
def test_deeply_nested_json_is_a_clean_error_or_accepted(opener: str, closer: str, depth: int) -> None:
    nested = opener * depth + "1" + closer * depth
    as_data = f'{{"inputs":[{{"name":"x","datatype":"FP32","shape":[1],"data":{nested}}}]}}'.encode()
    request = decode(as_data, None)
    if request is not None:  # a singleton nested list is still one element, row-major
        assert opener == "[" and request.inputs["x"].tolist() == [1.0]
    if depth <= 65:  # where the parser's recursion limit lies depends on the caller's stack: test the ends
        parse_json(nested.encode())
    elif depth > 100_000:  # the stdlib parser's recursion, or orjson's own depth limit
        with pytest.raises(InvalidInputError, match="malformed JSON"):
            parse_json(nested.encode())


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
@pytest.mark.parametrize("datatype", NUMERIC)
def test_non_finite_numbers_are_kept_for_floats_and_refused_otherwise(literal: str, datatype: str) -> None:
    """Strict JSON has no NaN/Infinity: a parser may refuse them (orjson), or read them as such (stdlib)."""
    body = f'{{"inputs":[{{"name":"x","datatype":"{datatype}","shape":[2],"data":[1, {literal}]}}]}}'.encode()
    request = decode(body, None)
    kind = np.dtype(DATATYPES[datatype]).kind
    if kind == "f":
        if request is not None:
            value = request.inputs["x"][1]
            assert math.isnan(value) if literal == "NaN" else math.isinf(value)
    else:
        assert request is None, f"{literal} was accepted as {datatype}"


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1, "5", True, [1], {"a": 1}])
def test_timeouts_that_are_not_finite_microseconds_are_refused(timeout: Any) -> None:
    with pytest.raises(InvalidInputError, match="parameters.timeout"):
        schedule_parameters({"timeout": timeout}, 5)


@pytest.mark.parametrize("field_path, value", [
    (("id",), 5), (("parameters",), []), (("outputs",), {}), (("outputs", 0), "y"),
    (("outputs", 0, "parameters", "binary_data"), "yes"), (("inputs",), {}), (("inputs", 0), []),
    (("inputs", 0, "name"), 7), (("inputs", 0, "datatype"), 3), (("inputs", 0, "shape"), "2"),
    (("inputs", 0, "shape", 0), 2.0), (("inputs", 0, "shape", 0), True), (("inputs", 0, "shape", 0), None),
    (("inputs", 0, "parameters"), [1]), (("inputs", 0, "data"), {"v": 1}), (("inputs", 0, "data", 0), "1.0"),
    (("inputs", 0, "data", 0), None), (("inputs", 0, "data", 0), [1, 2]),
])
def test_a_wrong_json_type_in_any_field_is_refused_naming_it(field_path: tuple, value: Any) -> None:
    document: dict[str, Any] = {"id": "r1", "parameters": {}, "outputs": [{"name": "y", "parameters": {}}],
                                "inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "parameters": {},
                                            "data": [1.0, 2.0]}]}
    target: Any = document
    for key in field_path[:-1]:
        target = target[key]
    target[field_path[-1]] = value
    with pytest.raises(InvalidInputError) as caught:
        decode_request(json.dumps(document).encode(), None)
    named = {"id": "'id'", "parameters": "parameters", "outputs": "output", "inputs": "input"}[field_path[0]]
    assert named in str(caught.value), caught.value


@given(st.integers(0, 200), st.booleans())
def test_truncated_and_padded_binary_bodies_are_refused(cut: int, pad: bool) -> None:
    array = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    body, header_length = _triton_body(array, binary=True)
    assume(0 < cut)
    forged = body + b"\0" * cut if pad else body[:max(0, len(body) - cut)]
    assert decode(forged, header_length) is None
