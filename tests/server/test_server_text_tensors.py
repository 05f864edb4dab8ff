"""Generative models through Triton's LLM tensor interface (``text_input`` in, ``text_output`` out): over
gRPC (``ModelInfer``, ``ModelStreamInfer`` streaming chunk by chunk) and HTTP ``/infer``, with the
reference clients ``tritonclient.grpc`` and ``tritonclient.http``.

Oracle: the served model's embedded API (``GenerativeModel.generate``, itself held against a
no-cache recompute by the generation tests) with the same prompt and sampling values.
"""

from __future__ import annotations

import json
import queue
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from server_fixtures import LiveServer

PROMPT = "open the settings menu then"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.decoder_zoo import DecoderShape, write_decoder_folder
    from edge_runtime.runtime import Runtime
    from edge_runtime.server.app import create_app
    from edge_runtime.server.config import ServerConfig
    from edge_runtime.serving.repository import ModelRepository

    root = tmp_path_factory.mktemp("text-tensors")
    write_decoder_folder(root / "chat" / "1", DecoderShape(hidden=64, intermediate=128, vocab=600,
                                                           max_positions=256), seed=1)
    runtime = Runtime(RuntimeConfig(cache_dir=tmp_path_factory.mktemp("cache"), probe_opencl=False,
                                    intra_op_threads=1))
    live = LiveServer(create_app(ServerConfig(port=0, grpc_port=0), ModelRepository(root, runtime))).start()
    yield live
    live.stop()
    runtime.close()


def _model(server: LiveServer) -> Any:
    from edge_runtime.server.state import STATE

    return server.app[STATE].repository.get("chat").model


@pytest.fixture(scope="module")
def grpc(server: LiveServer) -> Iterator[Any]:
    from edge_runtime.server.state import STATE

    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.app[STATE].grpc_port}")
    yield client
    client.close()


def _inputs(module: Any, prompt: str, *, stream: bool | None = None, sampling: dict | None = None,
            exclude: bool | None = None, **tensors: Any) -> list[Any]:
    items = []

    def add(name: str, datatype: str, value: Any) -> None:
        item = module.InferInput(name, [1], datatype)
        item.set_data_from_numpy(np.array([value], dtype=object if datatype == "BYTES" else None))
        items.append(item)

    add("text_input", "BYTES", prompt.encode())
    if stream is not None:
        add("stream", "BOOL", stream)
    if sampling is not None:
        add("sampling_parameters", "BYTES", json.dumps(sampling).encode())
    if exclude is not None:
        add("exclude_input_in_output", "BOOL", exclude)
    for name, value in tensors.items():
        item = module.InferInput(name, [1], "INT32" if isinstance(value, int) else "FP32")
        item.set_data_from_numpy(np.array([value], np.int32 if isinstance(value, int) else np.float32))
        items.append(item)
    return items


def _text(result: Any) -> str:
    return result.as_numpy("text_output")[0].decode()


def test_metadata_declares_the_text_tensors(grpc: Any, server: LiveServer) -> None:
    ours = grpc.get_model_metadata("chat", as_json=True)
    assert [(t["name"], t["datatype"]) for t in ours["inputs"]] == [
        ("text_input", "BYTES"), ("stream", "BOOL"), ("sampling_parameters", "BYTES"), ("exclude_input_in_output", "BOOL")]
    assert [(t["name"], t["datatype"]) for t in ours["outputs"]] == [("text_output", "BYTES")]
    http = thttp.InferenceServerClient(server.url)
    metadata = http.get_model_metadata("chat")
    assert [t["name"] for t in metadata["inputs"]] == [t["name"] for t in ours["inputs"]]
    assert "continuous batch" in metadata["edge_runtime"]["batching"]["reason"]
    http.close()


def test_a_whole_answer_over_grpc_and_http_equals_the_embedded_api(grpc: Any, server: LiveServer) -> None:
    expected = _model(server).generate(PROMPT, max_tokens=8, temperature=0).text
    sampling = {"max_tokens": 8, "temperature": 0}
    assert _text(grpc.infer("chat", _inputs(tgrpc, PROMPT, sampling=sampling))) == PROMPT + expected
    assert _text(grpc.infer("chat", _inputs(tgrpc, PROMPT, sampling=sampling, exclude=True))) == expected
    # TensorRT-LLM's ensemble sends sampling values as tensors; they win over sampling_parameters
    tensors = grpc.infer("chat", _inputs(tgrpc, PROMPT, sampling={"max_tokens": 2, "temperature": 0},
                                         exclude=True, max_tokens=8))
    assert _text(tensors) == expected
    assert tensors.get_response().parameters["finish_reason"].string_param == "length"
    http = thttp.InferenceServerClient(server.url)
    try:
        answer = http.infer("chat", _inputs(thttp, PROMPT, sampling=sampling, exclude=True))
        assert _text(answer) == expected
        with pytest.raises(InferenceServerException, match="stream over gRPC ModelStreamInfer") as caught:
            http.infer("chat", _inputs(thttp, PROMPT, stream=True))
        assert caught.value.status() == "400"
    finally:
        http.close()


def test_sampling_parameters_carry_a_constraint(grpc: Any, server: LiveServer) -> None:
    """vLLM's ``structured_outputs`` inside ``sampling_parameters``: the answer the embedded API gives under
    the same constraint, streamed or whole."""
    options = ["tap the home button", "scroll down", "go back"]
    sampling = {"max_tokens": 12, "temperature": 0, "structured_outputs": {"choice": options}}
    expected = _model(server).generate(PROMPT, max_tokens=12, structured_outputs={"choice": options}).text
    assert expected in options
    assert _text(grpc.infer("chat", _inputs(tgrpc, PROMPT, sampling=sampling, exclude=True))) == expected
    answers: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        grpc.async_stream_infer("chat", _inputs(tgrpc, PROMPT, stream=True, sampling=sampling))
        pieces = []
        while True:
            result, error = answers.get(timeout=60)
            assert error is None, error
            pieces.append(_text(result))
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        grpc.stop_stream()
    assert "".join(pieces) == expected


def test_a_stream_sends_each_chunk_and_flags_the_last(grpc: Any, server: LiveServer) -> None:
    expected = _model(server).generate(PROMPT, max_tokens=12, temperature=0).text
    for empty_final in (False, True):
        answers: queue.Queue = queue.Queue()
        grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            grpc.async_stream_infer("chat", _inputs(tgrpc, PROMPT, stream=True, sampling={"max_tokens": 12,
                                                                                          "temperature": 0}),
                                    request_id="r", enable_empty_final_response=empty_final)
            pieces, finals = [], []
            while not finals or not finals[-1]:
                result, error = answers.get(timeout=60)
                assert error is None, error
                response = result.get_response()
                finals.append(response.parameters["triton_final_response"].bool_param)
                if response.outputs:
                    pieces.append(_text(result))
                else:
                    assert empty_final  # the empty final response Triton's clients ask for
        finally:
            grpc.stop_stream()
        assert "".join(pieces) == expected and len(pieces) > 1  # chunk by chunk, without the prompt
        assert finals.count(True) == 1 and finals[-1]


def test_concurrent_streams_in_one_call_each_get_their_own_answer(grpc: Any, server: LiveServer) -> None:
    prompts = ["tap the search box", "scroll down twice", "go back home"]
    expected = {f"p{i}": _model(server).generate(p, max_tokens=10, temperature=0).text for i, p in enumerate(prompts)}
    answers: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for index, prompt in enumerate(prompts):
            grpc.async_stream_infer("chat", _inputs(tgrpc, prompt, stream=True, sampling={"max_tokens": 10,
                                                                                          "temperature": 0}),
                                    request_id=f"p{index}")
        texts = {key: "" for key in expected}
        done = set()
        while len(done) < len(prompts):
            result, error = answers.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            texts[response.id] += _text(result)
            if response.parameters["triton_final_response"].bool_param:
                done.add(response.id)
    finally:
        grpc.stop_stream()
    assert texts == expected


@pytest.mark.parametrize("case, message", [
    ("no_text", "needs the input 'text_input'"),
    ("json", "input 'sampling_parameters' must be a JSON object"),
    ("unknown", "unknown input(s) ['pixels'] for a text generator"),
    ("temperature", "temperature"),
    ("stream_unary", "input 'stream' is true: stream with ModelStreamInfer"),
])
def test_bad_text_requests_are_invalid_arguments_naming_the_fault(grpc: Any, case: str, message: str) -> None:
    inputs = _inputs(tgrpc, PROMPT, sampling={"temperature": -1} if case == "temperature" else None,
                     stream=True if case == "stream_unary" else None)
    if case == "no_text":
        inputs = inputs[1:] or [_inputs(tgrpc, PROMPT, stream=False)[1]]
    elif case == "json":
        bad = tgrpc.InferInput("sampling_parameters", [1], "BYTES")
        bad.set_data_from_numpy(np.array([b"{not json"], dtype=object))
        inputs.append(bad)
    elif case == "unknown":
        extra = tgrpc.InferInput("pixels", [1], "FP32")
        extra.set_data_from_numpy(np.zeros(1, np.float32))
        inputs.append(extra)
    with pytest.raises(InferenceServerException) as caught:
        grpc.infer("chat", inputs)
    assert "INVALID_ARGUMENT" in str(caught.value.status()) and message in caught.value.message(), caught.value
    assert grpc.is_model_ready("chat")
