"""A stage that fails inside a multi-stage plan re-runs on the host, and the answer says so.

The plan is the planner's real ``gpu`` cut of a chain model over the cpu backend
and a refusing stand-in accelerator (``planning_fakes``) told to fail one run.
Oracles: ONNX Runtime for the outputs; ``/metrics`` parsed by prometheus_client.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.protocol import codec
from server_fixtures import write
from test_server_metrics import samples, value

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "planning"))

from planning_fakes import HOST_SPEED, RefusingBackend, accel_speed, chain, feeds_for, ort_outputs  # noqa: E402


async def test_a_stage_fallback_shows_in_parameters_fallback_and_the_fallback_metric(
        aiohttp_client: Any, make_app: Any, tmp_path: Path) -> None:
    from backends.base import CompileOptions
    from backends.cpu import CPUBackend
    from edge_runtime.planning.plans import Planner

    proto = chain()
    root = tmp_path / "repository"
    write(root / "staged" / "1" / "model.onnx", proto)
    (root / "staged" / "config.toml").write_text(
        '[scheduler]\npolicy = "fixed"\nplan = "staged"\n[serving]\nbackend = "cpu"\n')
    accel = RefusingBackend(CPUBackend(), "restricted", refuse_ops=("Relu",))
    planner = Planner(proto, {"cpu": RefusingBackend(CPUBackend(), "cpu"), "restricted": accel},
                      {"cpu": HOST_SPEED, "restricted": accel_speed("restricted")}, host="cpu",
                      accelerator="restricted", input_shapes={"x": (64, 256)})
    executor = planner.compile(planner.layout("gpu"), CompileOptions(intra_op_threads=1))
    executor.name = "staged"
    assert len(executor.stages) > 1 and executor.stages[0].backend == "restricted"

    def plans(model: Any) -> dict[str, Any]:
        return {"staged": executor} if model.name == "staged" else {}

    client = await aiohttp_client(make_app(root=root, extra_plans=plans))
    feeds = feeds_for(proto, 2)
    accel.fail_runs = 1
    response = await client.post("/v2/models/staged/infer", data=codec.encode_request(feeds).body)
    assert response.status == 200, await response.text()
    document = await response.json()
    assert document["parameters"]["plan"] == "staged"
    assert "stage 0 (restricted) re-ran on cpu: BackendError" in document["parameters"]["fallback"]
    expected = ort_outputs(proto, feeds)
    for output in document["outputs"]:
        got = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
        np.testing.assert_allclose(got, expected[output["name"]], rtol=1e-4, atol=1e-4)

    again = await (await client.post("/v2/models/staged/infer", data=codec.encode_request(feeds).body)).json()
    assert "fallback" not in again["parameters"]
    found = samples(await (await client.get("/metrics")).text())
    assert value(found, "edge_runtime_backend_fallback_total", model="staged", backend="restricted",
                 reason="BackendError") == 1
