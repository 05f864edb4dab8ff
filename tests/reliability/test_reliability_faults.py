"""Faults the server must survive, each with its outcome asserted (ONNX Runtime is the oracle of every answer).

* an OpenCL stage failing mid-run (a BackendError, then a crash of another type): the request is
  answered from the cpu, the response and ``/metrics`` say so, the next request runs on OpenCL again;
* the OpenCL driver crashing its canary: models load on the cpu, nothing else notices;
* a corrupt model file dropped into the repository (new model, or over a served one): a 400 naming
  the file, the old version keeps serving, the index says why;
* a cache directory that cannot be created, or a disk that is full: the daemon serves anyway;
* the cloud peer slow, resetting connections, or killed mid-request: answered locally.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from edge_runtime.protocol import codec
from reliability_fixtures import Daemon, mlp_feeds
from server_fixtures import ort_run


def _outputs(document: dict[str, Any]) -> dict[str, np.ndarray]:
    return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in document["outputs"]}


def _close(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name].astype(want[name].dtype), want[name], rtol=1e-4, atol=1e-5)


# -- OpenCL ---------------------------------------------------------------------------------------
@pytest.fixture
def opencl_planner_plans(tmp_path: Path) -> Any:
    """``extra_plans`` giving the ``ocl`` model a gpu plan: real OpenCL stages (PoCL) with cpu islands,
    behind the planning suite's failure-injecting wrapper."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "planning"))
    from planning_fakes import HOST_SPEED, RefusingBackend, accel_speed

    from backends.base import CompileOptions
    from backends.cpu import CPUBackend
    from backends.opencl import OpenCLBackend
    from edge_runtime.planning.plans import Planner

    accel = RefusingBackend(OpenCLBackend(cache_dir=tmp_path / "ocl-cache"), "opencl", refuse_nodes=("sigmoid",))
    built: dict[str, Any] = {"accel": accel}

    def plans_for(model: Any) -> dict[str, Any]:
        if model.name != "ocl":
            return {}
        planner = Planner(onnx.load(str(model.path)), {"cpu": RefusingBackend(CPUBackend(), "cpu"), "opencl": accel},
                          {"cpu": HOST_SPEED, "opencl": accel_speed("opencl")}, host="cpu", accelerator="opencl",
                          input_shapes={"x": (2, 4, 8, 8)})
        built["gpu"] = planner.compile(planner.layout("gpu"), CompileOptions(intra_op_threads=1, cache_dir=None))
        return {"gpu": built["gpu"]}

    return plans_for, built


@pytest.mark.requires_opencl
async def test_an_opencl_stage_failing_mid_run_is_answered_from_the_cpu(
        aiohttp_client: Any, make_rel_app: Any, rel_repo_copy: Path, opencl_planner_plans: Any) -> None:
    from planning_fakes import feeds_for, skip_dag

    from backends.errors import BackendError

    plans_for, built = opencl_planner_plans
    model = skip_dag()
    (rel_repo_copy / "ocl" / "1").mkdir(parents=True)
    onnx.save(model, str(rel_repo_copy / "ocl" / "1" / "model.onnx"))
    (rel_repo_copy / "ocl" / "config.toml").write_text(
        '[serving]\nbackend = "cpu"\n[scheduler]\npolicy = "fixed"\nplan = "gpu"\n[batching]\nmax_batch_size = 0\n')
    client = await aiohttp_client(make_rel_app(rel_repo_copy, extra_plans=plans_for))
    accel = built["accel"]
    assert built["gpu"].stages[0].backend == "opencl"
    fallbacks = []
    for step, inject in enumerate((None, RuntimeError, None, "BackendError", None)):
        if inject == "BackendError":
            accel.fail_runs = 1
        elif inject is not None:
            accel.raise_type, accel.fail_runs = inject, 1
        feeds = feeds_for(model, 2, seed=step)
        response = await client.post("/v2/models/ocl/infer", data=codec.encode_request(feeds).body)
        assert response.status == 200, await response.text()
        document = await response.json()
        _close(_outputs(document), ort_run(rel_repo_copy / "ocl" / "1" / "model.onnx", feeds))
        parameters = document["parameters"]
        assert parameters["plan"] == "gpu" and "opencl" in parameters["backends"]
        fallbacks.append(parameters.get("fallback"))
        accel.raise_type = BackendError
    assert fallbacks[0] is None and fallbacks[2] is None and fallbacks[4] is None
    assert "stage 0 (opencl) re-ran on cpu" in fallbacks[1] and "RuntimeError" in fallbacks[1]
    assert "stage 0 (opencl) re-ran on cpu: BackendError" in fallbacks[3]
    assert built["gpu"].fallbacks and sum(built["gpu"].fallbacks.values()) == 2
    assert (await client.get("/v2/health/ready")).status == 200


@pytest.mark.requires_opencl
async def test_a_crashing_opencl_driver_is_contained_by_the_canary(
        aiohttp_client: Any, make_rel_app: Any, rel_repo_copy: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from backends.opencl.canary import FAULT_ENV
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    monkeypatch.setenv(FAULT_ENV, "crash")  # the canary child process dies of SIGSEGV
    (rel_repo_copy / "mlp" / "config.toml").write_text('[serving]\nbackend = "auto"\n')
    (rel_repo_copy / "gpu_only" / "1").mkdir(parents=True)
    os.link(rel_repo_copy / "mlp" / "1" / "model.onnx", rel_repo_copy / "gpu_only" / "1" / "model.onnx")
    (rel_repo_copy / "gpu_only" / "config.toml").write_text('[serving]\nbackend = "opencl"\n')
    runtime = Runtime(RuntimeConfig(cache_dir=tmp_path / "cache", intra_op_threads=1, probe_opencl=True))
    try:
        client = await aiohttp_client(make_rel_app(rel_repo_copy, runtime=runtime))
        metadata = await (await client.get("/v2/models/mlp")).json()
        assert metadata["edge_runtime"]["backend"] == "cpu", metadata["edge_runtime"]
        feeds = mlp_feeds(3, rows=2)
        response = await client.post("/v2/models/mlp/infer", data=codec.encode_request(feeds).body)
        assert response.status == 200
        _close(_outputs(await response.json()), ort_run(rel_repo_copy / "mlp" / "1" / "model.onnx", feeds))
        index = {e["name"]: e for e in await (await client.post("/v2/repository/index")).json()}
        assert index["gpu_only"]["state"] == "UNAVAILABLE" and "SIGSEGV" in index["gpu_only"]["reason"], index
        assert index["mlp"]["state"] == index["types"]["state"] == "READY"
    finally:
        runtime.close()


# -- the repository -------------------------------------------------------------------------------
CORRUPTIONS = {
    "garbage": lambda good: os.urandom(4096),
    "empty": lambda good: b"",
    "truncated": lambda good: good[:len(good) // 2],
    "flipped": lambda good: good[:100] + bytes(b ^ 0xFF for b in good[100:400]) + good[400:],
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
async def test_a_corrupt_model_file_is_refused_and_the_old_version_keeps_serving(
        aiohttp_client: Any, make_rel_app: Any, rel_repo_copy: Path, corruption: str) -> None:
    good_path = rel_repo_copy / "mlp" / "1" / "model.onnx"
    good = good_path.read_bytes()
    expected = ort_run(good_path, mlp_feeds(1))
    client = await aiohttp_client(make_rel_app(rel_repo_copy))
    (rel_repo_copy / "dropped" / "1").mkdir(parents=True)
    (rel_repo_copy / "dropped" / "1" / "model.onnx").write_bytes(CORRUPTIONS[corruption](good))
    response = await client.post("/v2/repository/models/dropped/load")
    assert 400 <= response.status < 500, response.status
    assert "model" in (await response.json())["error"]
    # The same corruption over the served model: the reload fails, version 1 keeps answering.
    good_path.write_bytes(CORRUPTIONS[corruption](good))
    response = await client.post("/v2/repository/models/mlp/load")
    assert 400 <= response.status < 500
    response = await client.post("/v2/models/mlp/infer", data=codec.encode_request(mlp_feeds(1)).body)
    assert response.status == 200
    _close(_outputs(await response.json()), expected)
    index = {(e["name"], e["version"]): e for e in await (await client.post("/v2/repository/index")).json()}
    assert index[("dropped", "1")]["state"] == "UNAVAILABLE" and index[("dropped", "1")]["reason"]
    assert index[("mlp", "1")]["state"] == "READY"


async def test_a_server_starts_with_corrupt_files_and_odd_folders_beside_good_models(
        aiohttp_client: Any, make_rel_app: Any, rel_repo_copy: Path) -> None:
    (rel_repo_copy / "broken" / "1").mkdir(parents=True)
    (rel_repo_copy / "broken" / "1" / "model.onnx").write_bytes(b"\x08\x07not onnx")
    (rel_repo_copy / "mlp" / "²").mkdir()  # a digit int() refuses: not a version, not a crash
    (rel_repo_copy / "mlp" / ("9" * 200)).mkdir()  # far beyond int64: ignored as well
    (rel_repo_copy / "bad config").mkdir()  # not a model name
    (rel_repo_copy / "badconf" / "1").mkdir(parents=True)
    (rel_repo_copy / "badconf" / "config.toml").write_text("[serving\n")
    client = await aiohttp_client(make_rel_app(rel_repo_copy))
    assert (await client.get("/v2/health/ready")).status == 200
    response = await client.post("/v2/models/mlp/infer", data=codec.encode_request(mlp_feeds(2)).body)
    assert response.status == 200
    index = {e["name"]: e for e in await (await client.post("/v2/repository/index")).json()}
    assert index["broken"]["state"] == "UNAVAILABLE" and index["mlp"]["state"] == "READY"


# -- the cache directory --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge_runtime.model_zoo import build_mlp
    from server_fixtures import write

    root = tmp_path_factory.mktemp("cache_faults") / "repository"
    write(root / "mlp" / "1" / "model.onnx", build_mlp(seed=0))  # backend "auto": OpenCL (PoCL) where present
    return root


@pytest.mark.parametrize("fault", ["not_creatable", "full_disk"])
async def test_an_unwritable_or_full_cache_directory_does_not_stop_the_daemon(
        small_repository: Path, tmp_path: Path, fault: str) -> None:
    import aiohttp

    if fault == "not_creatable":
        (tmp_path / "a_file").write_text("")
        cache, limit = tmp_path / "a_file" / "cache", None  # below a regular file: ENOTDIR on every write
    else:
        cache, limit = tmp_path / "cache", 0  # every file write fails with EFBIG, as on a full disk
    daemon = Daemon.start(small_repository, cache, tmp_path / "serve.log", max_file_bytes=limit)
    try:
        feeds = mlp_feeds(4, rows=3)
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{daemon.url}/v2/models/mlp/infer",
                                    data=codec.encode_request(feeds).body) as response:
                assert response.status == 200, await response.text()
                _close(_outputs(await response.json()), ort_run(small_repository / "mlp" / "1" / "model.onnx", feeds))
    finally:
        code = daemon.stop()
    log = daemon.log()
    assert code == 0 and "Traceback" not in log, log[-3000:]
    assert "cannot write" in log or "not writable" in log, log[-3000:]  # the operator is told
    if fault == "full_disk":
        assert not any(p.is_file() and p.stat().st_size for p in cache.rglob("*")) if cache.exists() else True


# -- the cloud peer -------------------------------------------------------------------------------
CLOUD_MODEL = '[serving]\nbackend = "cpu"\n[cloud]\nmode = "always"\nremote_model = "cnn"\n'


@pytest.fixture(scope="module")
def cloud_setup(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from cloud_fixtures import build_cnn, write_model

    base = tmp_path_factory.mktemp("cloud_faults")
    peer_repo, local_repo = base / "peer", base / "local"
    write_model(peer_repo, "cnn", build_cnn())
    write_model(local_repo, "cnn", build_cnn())
    (local_repo / "cnn" / "config.toml").write_text(CLOUD_MODEL)
    return base, peer_repo, local_repo


def _cloud_config(url: str, **changes: Any) -> Any:
    from edge_runtime.cloud.config import CloudConfig

    return dataclasses.replace(CloudConfig(url=url, timeout_ms=5000, breaker_failures=3, breaker_reset_ms=60_000,
                                           retry_backoff_ms=10), **changes)


async def _cnn_requests(client: Any, seeds: range) -> list[dict[str, Any]]:
    from cloud_fixtures import build_cnn, cnn_feeds, ort_outputs

    async def one(seed: int) -> dict[str, Any]:
        response = await client.post("/v2/models/cnn/infer", data=codec.encode_request(cnn_feeds(seed)).body)
        assert response.status == 200, await response.text()
        document = await response.json()
        _close(_outputs(document), ort_outputs(build_cnn(), cnn_feeds(seed)))
        return document["parameters"]

    return list(await asyncio.gather(*(one(seed) for seed in seeds)))


@pytest.mark.parametrize("link", ["slow", "reset"])
async def test_a_slow_or_resetting_cloud_peer_is_answered_locally(
        aiohttp_client: Any, make_rel_app: Any, cloud_setup: Any, link: str) -> None:
    from cloud_fixtures import ServerProcess
    from netem_proxy import LinkProfile, ShapingProxy

    base, peer_repo, local_repo = cloud_setup
    profile = {"slow": LinkProfile("slow", delay_ms=400),
               "reset": LinkProfile("reset", reset_after_bytes=64)}[link]  # reset mid-answer
    peer = ServerProcess.start(peer_repo, base / f"peer-{link}.log")
    try:
        with ShapingProxy("127.0.0.1", peer.port, profile) as proxy:
            config = _cloud_config(f"http://127.0.0.1:{proxy.port}", timeout_ms=300, retries=1)
            client = await aiohttp_client(make_rel_app(local_repo, cloud=config))
            answers = await _cnn_requests(client, range(4))
    finally:
        peer.stop()
    assert all(a["ran_on"] == "local" and a.get("fallback") for a in answers), answers
    if link == "slow":
        assert all(a["ran_twice"] for a in answers)  # it may also have run remotely: said, not hidden


async def test_a_cloud_peer_killed_mid_request_is_answered_locally(
        aiohttp_client: Any, make_rel_app: Any, cloud_setup: Any) -> None:
    from cloud_fixtures import ServerProcess
    from netem_proxy import LinkProfile, ShapingProxy

    base, peer_repo, local_repo = cloud_setup
    peer = ServerProcess.start(peer_repo, base / "peer-killed.log")
    try:
        with ShapingProxy("127.0.0.1", peer.port, LinkProfile("hold", delay_ms=500)) as proxy:
            client = await aiohttp_client(make_rel_app(local_repo, cloud=_cloud_config(
                f"http://127.0.0.1:{proxy.port}", retries=1)))
            before = await _cnn_requests(client, range(1))
            assert before[0]["ran_on"] == "cloud"
            in_flight = asyncio.ensure_future(_cnn_requests(client, range(1, 7)))
            await asyncio.sleep(0.2)  # NOTE: not a synchronisation: any moment of the 1 s round trip will do
            os.kill(peer.process.pid, signal.SIGKILL)
            answers = await in_flight
            after = await _cnn_requests(client, range(7, 10))
    finally:
        peer.stop()
    # in flight at the kill: the call failed and the request re-ran here; later: the breaker keeps them here
    assert all(a["ran_on"] == "local" and (a.get("fallback") or "breaker" in a.get("route", ""))
               for a in answers + after), answers + after
    assert all("breaker" in a.get("route", "") or a.get("fallback") for a in after)
    assert (await client.get("/v2/health/ready")).status == 200


# -- a TFLite delegate ----------------------------------------------------------------------------
def _test_delegate(out: Path) -> Path:
    """The tflite suite's external test delegate, compiled here (see tests/backends/tflite)."""
    import shutil
    import subprocess

    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler is not None, "no C compiler to build the test delegate"
    source = Path(__file__).resolve().parents[1] / "backends" / "tflite" / "edge_test_delegate.c"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(out), str(source)], check=True,
                   capture_output=True)
    return out


@pytest.mark.requires_litert
@pytest.mark.filterwarnings("ignore:Exception ignored in.*Delegate.__del__:pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("failure", ["prepare", "create", "missing_library"])
async def test_a_delegate_that_fails_to_load_leaves_the_model_serving_on_cpu(
        aiohttp_client: Any, make_rel_app: Any, rel_repo_copy: Path, tmp_path: Path, failure: str) -> None:
    import make_tflite_models
    from ai_edge_litert.interpreter import Interpreter

    from backends.base import DelegateSpec
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    make_tflite_models.main([str(tmp_path / "tflite")])
    model_dir = rel_repo_copy / "tfl" / "1"
    model_dir.mkdir(parents=True)
    (model_dir / "model.tflite").write_bytes((tmp_path / "tflite" / "float_cnn.tflite").read_bytes())
    if failure == "missing_library":
        spec = DelegateSpec(str(tmp_path / "libno_such_delegate.so"))
    else:
        spec = DelegateSpec(str(_test_delegate(tmp_path / "libdelegate.so")), (("fail", failure),))
    runtime = Runtime(RuntimeConfig(cache_dir=tmp_path / "cache", intra_op_threads=1, probe_opencl=False,
                                    delegates=(spec,)))
    try:
        from edge_runtime.server.state import STATE

        app = make_rel_app(rel_repo_copy, runtime=runtime)
        client = await aiohttp_client(app)
        status = app[STATE].repository.get("tfl").model.executable.delegate_status
        assert status.loaded is False and status.error, status  # the failure is kept and said, not hidden
        x = np.random.default_rng(5).random((1, 16, 16, 3), dtype=np.float32)
        response = await client.post("/v2/models/tfl/infer", data=codec.encode_request({"image": x}).body)
        assert response.status == 200, await response.text()
        interpreter = Interpreter(model_path=str(model_dir / "model.tflite"), num_threads=1)
        interpreter.allocate_tensors()
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
        interpreter.invoke()
        want = {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}
        _close(_outputs(await response.json()), want)
        assert (await client.post("/v2/models/mlp/infer", data=codec.encode_request(mlp_feeds(0)).body)).status == 200
    finally:
        runtime.close()
