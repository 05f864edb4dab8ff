"""KServe v2 gRPC beside HTTP, through the reference client ``tritonclient.grpc`` (sync, asyncio, streaming)
and the protocol's raw stub, against a live server on loopback.

Oracles: ONNX Runtime on the same files, and the same server's HTTP answers (metadata, statistics,
errors): the two transports share one data plane and must say the same thing.
"""

from __future__ import annotations

import asyncio
import queue
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from server_fixtures import LiveServer, ort_run, type_feeds

TOKEN = "grpc-test-token"


def _grpc_inputs(arrays: dict[str, np.ndarray]) -> list[Any]:
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == object else tgrpc.np_to_triton_dtype(array.dtype)
        item = tgrpc.InferInput(name, list(array.shape), datatype)
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


@pytest.fixture(scope="module")
def grpc_server(tmp_path_factory: pytest.TempPathFactory, runtime: Any, repo: Path) -> Iterator[LiveServer]:
    from edge_runtime.server.app import create_app
    from edge_runtime.server.config import ServerConfig
    from edge_runtime.serving.repository import ModelRepository

    root = Path(shutil.copytree(repo, tmp_path_factory.mktemp("grpc") / "repository"))
    server = LiveServer(create_app(ServerConfig(port=0, grpc_port=0), ModelRepository(root, runtime))).start()
    yield server
    server.stop()


def _grpc_url(server: LiveServer) -> str:
    from edge_runtime.server.state import STATE

    return f"127.0.0.1:{server.app[STATE].grpc_port}"


@pytest.fixture(scope="module")
def client(grpc_server: LiveServer) -> Iterator[Any]:
    client = tgrpc.InferenceServerClient(_grpc_url(grpc_server))
    yield client
    client.close()


@pytest.fixture(scope="module")
def http(grpc_server: LiveServer) -> Iterator[Any]:
    client = thttp.InferenceServerClient(grpc_server.url, connection_timeout=30, network_timeout=60)
    yield client
    client.close()


def test_health_metadata_and_config_say_what_http_says(client: Any, http: Any) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "2")
    assert not client.is_model_ready("absent") and not client.is_model_ready("mlp", "9")
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == http.get_server_metadata()["name"]
    assert metadata["extensions"] == http.get_server_metadata()["extensions"]
    for name in ("mobilenet", "types", "mlp"):
        ours = client.get_model_metadata(name, as_json=True)
        theirs = http.get_model_metadata(name)
        assert ours["name"] == theirs["name"] and ours["versions"] == theirs["versions"]
        assert ours["platform"] == theirs["platform"]
        for key in ("inputs", "outputs"):  # MessageToJson writes int64 shapes as strings
            assert [{**t, "shape": [int(d) for d in t["shape"]]} for t in ours[key]] == theirs[key]
    config = client.get_model_config("mobilenet", as_json=True)["config"]
    reference = http.get_model_config("mobilenet")
    assert config["name"] == "mobilenet" and int(config.get("max_batch_size", 0)) == reference["max_batch_size"]
    assert config["input"][0]["name"] == "input" and config["input"][0]["data_type"] == "TYPE_FP32"
    batched = reference["max_batch_size"] > 0  # Triton's dims leave the batch dimension out when it batches
    assert [int(d) for d in config["input"][0]["dims"]] == reference["input"][0]["shape"][1 if batched else 0:]


def test_infer_equals_onnxruntime_with_id_priority_timeout_and_plan(client: Any, repo: Path) -> None:
    image = np.random.default_rng(11).standard_normal((2, 3, 64, 64)).astype(np.float32)
    result = client.infer("mobilenet", _grpc_inputs({"input": image}),
                          outputs=[tgrpc.InferRequestedOutput("probabilities")], request_id="g-1", priority=1,
                          timeout=10_000_000)
    expected = ort_run(repo / "mobilenet" / "1" / "model.onnx", {"input": image})["probabilities"]
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-5, atol=1e-6)
    response = result.get_response()
    assert response.id == "g-1" and response.model_name == "mobilenet" and response.model_version == "1"
    assert response.parameters["plan"].string_param and response.parameters["ran_on"].string_param == "local"


def test_every_datatype_equals_onnxruntime(client: Any, repo: Path) -> None:
    feeds = type_feeds(seed=4)
    wire = {k: (np.array([str(e).encode() for e in v.ravel()], object).reshape(v.shape) if v.dtype == object else v)
            for k, v in feeds.items()}
    result = client.infer("types", _grpc_inputs(wire))  # no outputs named: all of them
    for name, want in ort_run(repo / "types" / "1" / "model.onnx", feeds).items():
        got = result.as_numpy(name)
        if want.dtype == object:
            got = np.array([g.decode() for g in got.ravel()], object).reshape(want.shape)
        np.testing.assert_array_equal(got, want)


def _stub(server: LiveServer) -> tuple[Any, Any]:
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    channel = grpc.insecure_channel(_grpc_url(server))
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def test_typed_contents_answer_as_raw_bytes_do(grpc_server: LiveServer, repo: Path) -> None:
    """The protocol's other input form (``contents.fp32_contents``), through the raw stub."""
    from tritonclient.grpc import service_pb2

    x = np.random.default_rng(5).standard_normal((2, 64)).astype(np.float32)
    request = service_pb2.ModelInferRequest(model_name="mlp", model_version="1", id="typed")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[2, 64])
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    channel, stub = _stub(grpc_server)
    with channel:
        response = stub.ModelInfer(request, timeout=60)
    assert response.id == "typed" and [o.name for o in response.outputs] == ["logits"]
    got = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(list(response.outputs[0].shape))
    np.testing.assert_allclose(got, ort_run(repo / "mlp" / "1" / "model.onnx", {"input": x})["logits"],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case, code, message", [
    ("dtype", "INVALID_ARGUMENT", "input 'input': the model expects datatype FP32, the request sent FP64"),
    ("model", "NOT_FOUND", "unknown model 'absent'"),
    ("short", "INVALID_ARGUMENT", "needs 768 bytes, its raw_input_contents entry's size is 8"),
    ("fp16", "INVALID_ARGUMENT", "datatype FP16 has no typed contents: send it in raw_input_contents"),
    ("mixed", "INVALID_ARGUMENT", "has typed contents but the request uses raw_input_contents"),
    ("extra", "INVALID_ARGUMENT", "raw_input_contents has 2 entries; the inputs use 1"),
    ("output", "INVALID_ARGUMENT", "unknown output(s) ['nope']"),
    ("async", "INVALID_ARGUMENT", "parameters.async is an HTTP extension"),
])
def test_bad_requests_get_the_http_message_and_a_grpc_code(grpc_server: LiveServer, client: Any, case: str,
                                                           code: str, message: str) -> None:
    import grpc
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name="absent" if case == "model" else "mlp", model_version="1")
    tensor = request.inputs.add(name="input", datatype="FP64" if case == "dtype" else "FP32", shape=[3, 64])
    x = np.zeros((3, 64), np.float64 if case == "dtype" else np.float32)
    if case == "fp16":
        tensor.datatype = "FP16"
    elif case == "mixed":
        tensor.contents.fp32_contents.extend([0.0] * 192)
        request.inputs.add(name="other", datatype="FP32", shape=[1])
        request.raw_input_contents.append(b"\0" * 4)
    if case not in ("fp16", "mixed"):
        request.raw_input_contents.append(b"\0" * 8 if case == "short" else x.tobytes())
    if case == "extra":
        request.raw_input_contents.append(b"\0" * 4)
    if case == "output":
        request.outputs.add(name="nope")
    if case == "async":
        request.parameters["async"].bool_param = True
    channel, stub = _stub(grpc_server)
    with channel:
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, timeout=60)
    assert caught.value.code().name == code, caught.value
    assert message in caught.value.details(), caught.value.details()
    # the reference client shows the same: and the server keeps answering
    assert client.is_model_ready("mlp")


def test_repository_statistics_and_http_agree(client: Any, http: Any) -> None:
    index = {(m["name"], m.get("version"), m.get("state")) for m in client.get_model_repository_index(as_json=True)
             ["models"]}
    assert ("mlp", "2", "READY") in index
    x = np.ones((1, 64), np.float32)
    client.infer("mlp", _grpc_inputs({"input": x}), model_version="2")
    ours = client.get_inference_statistics("mlp", "2", as_json=True)["model_stats"][0]
    theirs = http.get_inference_statistics("mlp", "2")["model_stats"][0]
    assert int(ours["inference_count"]) == theirs["inference_count"] >= 1
    assert int(ours["inference_stats"]["success"]["count"]) == theirs["inference_stats"]["success"]["count"]
    client.unload_model("types")
    assert not client.is_model_ready("types")
    with pytest.raises(InferenceServerException, match="load overrides"):
        client.load_model("types", config='{"max_batch_size": 4}')
    client.load_model("types")
    assert client.is_model_ready("types")


def test_system_shared_memory_in_and_out_equals_onnxruntime(client: Any, repo: Path, regions: Any) -> None:
    x = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float32)
    in_name, in_key, in_handle = regions(x.nbytes + 64)
    out_name, out_key, out_handle = regions(3 * 10 * 4)
    shm.set_shared_memory_region(in_handle, [x], offset=64)
    client.register_system_shared_memory(in_name, in_key, x.nbytes + 64)
    client.register_system_shared_memory(out_name, out_key, 3 * 10 * 4)
    try:
        status = client.get_system_shared_memory_status(as_json=True)["regions"]
        assert status[in_name]["key"] == in_key and int(status[in_name]["byte_size"]) == x.nbytes + 64
        item = tgrpc.InferInput("input", [3, 64], "FP32")
        item.set_shared_memory(in_name, x.nbytes, offset=64)
        wanted = tgrpc.InferRequestedOutput("logits")
        wanted.set_shared_memory(out_name, 3 * 10 * 4)
        result = client.infer("mlp", [item], outputs=[wanted], model_version="1")
        output = result.get_output("logits")
        assert output.parameters["shared_memory_region"].string_param == out_name
        got = shm.get_contents_as_numpy(out_handle, np.float32, [3, 10])
        np.testing.assert_allclose(got, ort_run(repo / "mlp" / "1" / "model.onnx", {"input": x})["logits"],
                                   rtol=1e-5, atol=1e-6)
        with pytest.raises(InferenceServerException, match="not registered"):
            client.get_system_shared_memory_status("nope")
    finally:
        client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}
    with pytest.raises(InferenceServerException, match="CUDA shared memory is not supported"):
        client.get_cuda_shared_memory_status()


def test_a_stream_answers_every_request_and_an_error_does_not_end_it(client: Any, repo: Path) -> None:
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        rows = [np.random.default_rng(seed).standard_normal((1, 64)).astype(np.float32) for seed in range(5)]
        for index, x in enumerate(rows):
            client.async_stream_infer("mlp", _grpc_inputs({"input": x}), request_id=f"s-{index}", model_version="1")
        client.async_stream_infer("absent", _grpc_inputs({"input": rows[0]}), request_id="s-bad")
        client.async_stream_infer("mlp", _grpc_inputs({"input": rows[4]}), request_id="s-after", model_version="1")
        got = [answers.get(timeout=60) for _ in range(len(rows) + 2)]
    finally:
        client.stop_stream()
    errors = [error for _, error in got if error is not None]
    assert len(errors) == 1 and "unknown model 'absent'" in str(errors[0])
    results = {result.get_response().id: result for result, error in got if error is None}
    assert sorted(results) == sorted([f"s-{i}" for i in range(len(rows))] + ["s-after"])
    model = repo / "mlp" / "1" / "model.onnx"
    for index, x in enumerate(rows):
        np.testing.assert_allclose(results[f"s-{index}"].as_numpy("logits"), ort_run(model, {"input": x})["logits"],
                                   rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(results["s-after"].as_numpy("logits"), results["s-4"].as_numpy("logits"))


def test_concurrent_asyncio_calls_get_their_own_answers(grpc_server: LiveServer, repo: Path) -> None:
    import tritonclient.grpc.aio as agrpc

    rows = [np.random.default_rng(100 + i).standard_normal((1, 64)).astype(np.float32) for i in range(16)]

    async def main() -> list[np.ndarray]:
        aclient = agrpc.InferenceServerClient(_grpc_url(grpc_server))
        try:
            results = await asyncio.gather(*(aclient.infer("mlp", _grpc_inputs({"input": x}), model_version="1")
                                             for x in rows))
        finally:
            await aclient.close()
        return [r.as_numpy("logits") for r in results]

    model = repo / "mlp" / "1" / "model.onnx"
    for x, got in zip(rows, asyncio.run(main())):
        np.testing.assert_allclose(got, ort_run(model, {"input": x})["logits"], rtol=1e-5, atol=1e-6)


def test_a_token_guards_every_call_but_health(tmp_path: Path, runtime: Any, repo: Path) -> None:
    from edge_runtime.server.app import create_app
    from edge_runtime.server.config import ServerConfig
    from edge_runtime.serving.repository import ModelRepository

    root = Path(shutil.copytree(repo, tmp_path / "repository"))
    server = LiveServer(create_app(ServerConfig(port=0, grpc_port=0, token=TOKEN),
                                   ModelRepository(root, runtime))).start()
    try:
        bare = tgrpc.InferenceServerClient(_grpc_url(server))
        assert bare.is_server_live() and bare.is_server_ready()
        x = np.ones((1, 64), np.float32)
        with pytest.raises(InferenceServerException, match="missing or wrong bearer token") as caught:
            bare.infer("mlp", _grpc_inputs({"input": x}))
        assert "UNAUTHENTICATED" in str(caught.value.status())
        with pytest.raises(InferenceServerException, match="UNAUTHENTICATED|bearer token"):
            bare.get_model_metadata("mlp")
        answers: queue.Queue = queue.Queue()
        bare.start_stream(callback=lambda result, error: answers.put(error))
        try:  # the stream is refused as it opens: the client may have marked it broken already
            bare.async_stream_infer("mlp", _grpc_inputs({"input": x}))
        except InferenceServerException:
            pass
        assert "bearer token" in str(answers.get(timeout=60))
        bare.stop_stream()
        bare.close()
        good = tgrpc.InferenceServerClient(_grpc_url(server))
        headers = {"authorization": f"Bearer {TOKEN}"}
        assert good.infer("mlp", _grpc_inputs({"input": x}), headers=headers).as_numpy("logits").shape == (1, 10)
        with pytest.raises(InferenceServerException, match="bearer token"):
            good.infer("mlp", _grpc_inputs({"input": x}), headers={"authorization": "Bearer wrong"})
        good.close()
    finally:
        server.stop()


def test_grpc_port_settings_are_checked() -> None:
    from edge_runtime.errors import ConfigError
    from edge_runtime.server.config import ServerConfig, load_settings

    assert load_settings(env={"EDGE_RUNTIME_GRPC_PORT": "8001"}).server.grpc_port == 8001
    assert load_settings(env={}).server.grpc_port is None
    with pytest.raises(ConfigError, match="grpc_port must be in 0..65535, got 70000"):
        ServerConfig(grpc_port=70000)


def test_a_lazily_loaded_model_loads_on_its_first_grpc_call(tmp_path: Path, runtime: Any, repo: Path) -> None:
    """``[memory] lazy_load``: the model is not served until a request names it, over gRPC as over HTTP."""
    from edge_runtime.memory_budget import MemoryConfig
    from edge_runtime.server.app import create_app
    from edge_runtime.server.config import ServerConfig
    from edge_runtime.serving.repository import ModelRepository

    root = Path(shutil.copytree(repo, tmp_path / "repository"))
    server = LiveServer(create_app(ServerConfig(port=0, grpc_port=0), ModelRepository(
        root, runtime, memory=MemoryConfig(lazy_load=True)))).start()
    try:
        client = tgrpc.InferenceServerClient(_grpc_url(server))
        assert not client.is_model_ready("mlp")  # not loaded yet
        x = np.random.default_rng(12).standard_normal((2, 64)).astype(np.float32)
        got = client.infer("mlp", _grpc_inputs({"input": x}), model_version="1").as_numpy("logits")
        np.testing.assert_allclose(got, ort_run(repo / "mlp" / "1" / "model.onnx", {"input": x})["logits"],
                                   rtol=1e-5, atol=1e-6)
        assert client.is_model_ready("mlp")
        client.close()
    finally:
        server.stop()
