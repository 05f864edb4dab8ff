"""A third-party KServe v2 server hosts the tail: MLServer (1.7.1), with a tiny ONNX Runtime runtime.

MLServer's dependency pins clash with ours, so it lives in its own venv; its
Python comes from ``EDGE_RUNTIME_TEST_KSERVE_PYTHON`` (``.ci/run`` creates it).
Missing: skipped locally, a failure under CI=true. MLServer's REST front end
has no binary tensor extension, so the client speaks JSON to it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
import pytest

from cloud_fixtures import build_cnn, build_dag, cnn_feeds, free_port, ort_outputs

ENV_VAR = "EDGE_RUNTIME_TEST_KSERVE_PYTHON"
IN_CI = os.environ.get("CI", "").lower() == "true"

# The custom runtime MLServer imports from the model folder: the tail on ONNX Runtime, nothing else.
RUNTIME_SOURCE = '''
import onnxruntime
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OnnxTail(MLModel):
    async def load(self) -> bool:
        path = await get_model_uri(self._settings, wellknown_filenames=["model.onnx"])
        self._session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        self._names = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {item.name: NumpyCodec.decode_input(item) for item in payload.inputs}
        values = self._session.run(self._names, feeds)
        return InferenceResponse(model_name=self.name,
                                 outputs=[NumpyCodec.encode_output(n, v) for n, v in zip(self._names, values)])
'''


def _mlserver_python() -> str:
    python = os.environ.get(ENV_VAR, "")
    if python and Path(python).is_file():
        return python
    reason = f"{ENV_VAR} is not set to a Python with mlserver installed (got {python!r}); see .ci/run"
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: this must run, not skip)")
    pytest.skip(reason)


def _model_folder(root: Path, name: str, model: onnx.ModelProto) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    (folder / "onnx_tail_runtime.py").write_text(RUNTIME_SOURCE)
    (folder / "model-settings.json").write_text(json.dumps(
        {"name": name, "implementation": "onnx_tail_runtime.OnnxTail", "parameters": {"uri": "./model.onnx"}}))


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from edge_runtime.cloud.split import ModelCutter

    python = _mlserver_python()
    root = tmp_path_factory.mktemp("mlserver")
    cnn = ModelCutter(build_cnn())
    _model_folder(root, "cnn_tail", cnn.extract(cnn.resolve("pool1"))[1])
    dag = ModelCutter(build_dag())
    _model_folder(root, "dag_tail", dag.extract(dag.resolve("r"))[1])
    port = free_port()
    (root / "settings.json").write_text(json.dumps(
        {"host": "127.0.0.1", "http_port": port, "grpc_port": free_port(), "metrics_port": free_port(),
         "parallel_workers": 0, "debug": False}))
    log_path = root / "mlserver.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([python, "-m", "mlserver.cli.main", "start", str(root)], cwd=root,
                                   stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, ["cnn_tail", "dag_tail"], process, log_path, timeout_s=90)
        yield url
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=5)


def _wait_ready(url: str, models: list[str], process: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mlserver exited with {process.returncode}: {log_path.read_text()[-3000:]}")
        try:
            if all(urllib.request.urlopen(f"{url}/v2/models/{m}/ready", timeout=1).status == 200 for m in models):
                return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"mlserver not ready within {timeout_s} s: {log_path.read_text()[-3000:]}")


def test_split_on_mlserver_equals_the_whole_model(mlserver: str, runtime) -> None:
    from edge_runtime.cloud.client import CloudClient
    from edge_runtime.cloud.config import CloudConfig, CloudModelConfig
    from edge_runtime.cloud.factory import cloud_plans, runtime_compiler

    config = CloudConfig(url=mlserver, binary_tensors=False, timeout_ms=10_000)
    with CloudClient(config) as client:
        assert client.ready() and client.ready("cnn_tail")
        cnn_plan, = cloud_plans(build_cnn(), CloudModelConfig(mode="split", remote_model="cnn_tail",
                                                               split_at="pool1"),
                                client, runtime_compiler(runtime), repeat=2).values()
        dag_plan, = cloud_plans(build_dag(), CloudModelConfig(mode="split", remote_model="dag_tail", split_at="r"),
                                client, runtime_compiler(runtime), repeat=2).values()
        for seed in range(3):
            run = cnn_plan.execute(cnn_feeds(seed), finish_locally=False)
            assert run.tail_ran_on == "cloud" and run.call is not None and run.call.server_ms is None
            np.testing.assert_allclose(run.outputs["probabilities"],
                                       ort_outputs(build_cnn(), cnn_feeds(seed))["probabilities"], rtol=1e-4,
                                       atol=1e-6)
            feeds = {"x": np.random.default_rng(seed).standard_normal((2, 8, 16)).astype(np.float32)}
            run = dag_plan.execute(feeds, finish_locally=False)  # two tensors cross, one the original input
            assert run.call is not None and sorted(run.call.outputs) == ["y"]
            np.testing.assert_allclose(run.outputs["y"], ort_outputs(build_dag(), feeds)["y"], rtol=1e-4, atol=1e-6)
        # The network estimate learns from a peer that reports no compute time too.
        assert client.network.snapshot().rtt_samples + client.network.snapshot().bandwidth_samples >= 3


def test_mlserver_error_answers_are_cloud_failures(mlserver: str) -> None:
    from edge_runtime.cloud.client import CloudCallError, CloudClient
    from edge_runtime.cloud.config import CloudConfig

    config = CloudConfig(url=mlserver, binary_tensors=False)
    with CloudClient(config) as client:
        with pytest.raises(CloudCallError) as caught:
            client.infer("no_such_model", cnn_feeds())
    assert caught.value.kind == "http_error" and caught.value.status == 404 and not caught.value.maybe_ran
    with CloudClient(dataclasses.replace(config, binary_tensors=True)) as client:
        with pytest.raises(CloudCallError) as caught:  # MLServer has no binary tensor extension over REST
            client.infer("cnn_tail", {"pool1": np.zeros((1, 16, 8, 8), np.float32)})
    assert caught.value.kind in ("http_error", "bad_response")
