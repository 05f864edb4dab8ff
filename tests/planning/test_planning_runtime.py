"""Plans through the Runtime facade and the CLI: ``rt.load(plan=...)``, ``rt.plans``,
``edge-runtime plan`` and ``edge-runtime run --plan/--backend auto``.

In-process tests give the Runtime a refusing accelerator (the cpu backend
behind ``RefusingBackend``) so they run anywhere; the CLI tests run the real
command as a subprocess, on whatever backends this machine has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from backends.base import Availability
from backends.errors import BackendUnavailableError, InvalidInputError
from planning_fakes import (
    HOST_SPEED,
    RefusingBackend,
    accel_speed,
    assert_close_to,
    feeds_for,
    ocr_models,
    ort_outputs,
    skip_dag,
)

ROOT = Path(__file__).resolve().parents[2]


OCR = ocr_models()
needs_ocr = pytest.mark.skipif(not OCR and os.environ.get("CI") != "true",
                               reason="rapidocr-onnxruntime (test extra) is not installed")


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "skip_dag.onnx"
    onnx.save(skip_dag(), str(path))
    return path


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A Runtime whose accelerator is the cpu backend refusing the ``sigmoid`` node."""
    from backends.cpu import CPUBackend
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    rt = Runtime(RuntimeConfig(cache_dir=tmp_path / "cache"))
    accel = RefusingBackend(CPUBackend(), "restricted", refuse_nodes=("sigmoid",))
    monkeypatch.setitem(rt._backends, "restricted", (accel, Availability.yes("fake accelerator")))
    monkeypatch.setattr(rt, "accelerator", lambda: "restricted")
    speeds = {"cpu": HOST_SPEED, "restricted": accel_speed("restricted")}
    monkeypatch.setattr(rt, "backend_speed", lambda name: speeds[name])
    # Pinned speeds test the estimate logic; the measured race of auto has its own tests
    # (test_auto_measured.py), on the real backends with real calibration.
    monkeypatch.setattr(rt, "measured_choice", lambda *args, **kwargs: None)
    yield rt
    rt.close()


@pytest.mark.aarch64
def test_load_with_each_plan_equals_onnxruntime(runtime: Any, model_path: Path) -> None:
    model_proto = onnx.load(str(model_path))
    for plan in ("cpu", "gpu", "hybrid", "auto"):
        model = runtime.load(model_path, plan=plan, input_shapes={"x": (32, 4, 8, 8)})
        for batch in (1, 4):
            feeds = feeds_for(model_proto, batch, seed=batch)
            assert_close_to(model.run(feeds), ort_outputs(model_proto, feeds))
        assert sum(model.backend_nodes.values()) == len(model_proto.graph.node)
        assert f"plan {plan!r}" in model.report.reason
        assert model.describe()["executable"]["plan"] == plan
    assert runtime.load(model_path, plan="cpu").backend == "cpu"
    assert runtime.load(model_path, plan="gpu", input_shapes={"x": (32, 4, 8, 8)}).backend == "restricted+cpu"


def test_backend_auto_uses_the_auto_plan_when_an_accelerator_is_usable(runtime: Any, model_path: Path) -> None:
    model = runtime.load(model_path, input_shapes={"x": (32, 4, 8, 8)})
    assert model.describe()["executable"]["plan"] == "auto"
    assert set(model.backend_nodes) == {"restricted", "cpu"}
    feeds = feeds_for(onnx.load(str(model_path)), 2)
    assert_close_to(model.run(feeds), ort_outputs(onnx.load(str(model_path)), feeds))


def test_plans_satisfy_the_scheduler_plan_protocol(runtime: Any, model_path: Path) -> None:
    plans = runtime.plans(model_path, input_shapes={"x": (32, 4, 8, 8)})
    assert set(plans) == {"cpu", "gpu", "hybrid", "auto"}
    feeds = feeds_for(onnx.load(str(model_path)), 3)
    want = ort_outputs(onnx.load(str(model_path)), feeds)
    for name, plan in plans.items():
        assert plan.name == name and isinstance(plan.backends, tuple) and plan.estimated_ms > 0
        assert_close_to(plan.run(feeds), want)


def test_a_backend_and_a_plan_together_are_refused(runtime: Any, model_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="not both"):
        runtime.load(model_path, backend="cpu", plan="gpu")


@pytest.mark.aarch64
def test_without_an_accelerator_gpu_plans_are_absent_and_auto_is_cpu(runtime: Any, model_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "accelerator", lambda: None)
    with pytest.raises(BackendUnavailableError, match="needs an accelerator"):
        runtime.load(model_path, plan="gpu")
    assert set(runtime.plans(model_path)) == {"cpu", "auto"}
    model = runtime.load(model_path, plan="auto")
    assert model.backend == "cpu" and model.backend_nodes == {"cpu": len(skip_dag().graph.node)}


@needs_ocr
@pytest.mark.parametrize("kind,shape,refused", [("det", (1, 3, 64, 96), ("Resize", "HardSigmoid")),
                                                ("cls", (2, 3, 48, 192), ("HardSigmoid", "Softmax")),
                                                ("rec", (2, 3, 48, 96), ("Softmax", "ReduceMean", "Reshape"))])
def test_real_ocr_models_split_across_backends_equal_onnxruntime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 kind: str, shape: tuple, refused: tuple) -> None:
    """Mixed plans on real exported models; the accelerator refuses ops GPU backends often lack."""
    from backends.cpu import CPUBackend
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    assert kind in OCR, f"PP-OCR {kind} model not found in rapidocr_onnxruntime"
    rt = Runtime(RuntimeConfig(cache_dir=tmp_path))
    accel = RefusingBackend(CPUBackend(), "restricted", refuse_ops=refused)
    monkeypatch.setitem(rt._backends, "restricted", (accel, Availability.yes("fake accelerator")))
    monkeypatch.setattr(rt, "accelerator", lambda: "restricted")
    monkeypatch.setattr(rt, "backend_speed", lambda n: {"cpu": HOST_SPEED, "restricted": accel_speed(n)}[n])
    monkeypatch.setattr(rt, "measured_choice", lambda *args, **kwargs: None)  # the split is what is tested
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    model = rt.load(OCR[kind], input_shapes={"x": shape})
    assert set(model.backend_nodes) == {"restricted", "cpu"}, "a mixed plan"
    want = ort_outputs(onnx.load(str(OCR[kind])), {"x": x})
    got = model.run({"x": x})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
    rt.close()


# -- the command line -------------------------------------------------------------------
def cli(*args: str, cache: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGE_RUNTIME_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "edge_runtime", *args], capture_output=True, text=True,
                            env=env, timeout=300)
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def cli_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the CLI tests, so backends are calibrated once."""
    return tmp_path_factory.mktemp("cli-cache")


def test_cli_plan_json_lists_stages_with_costs_and_boundaries(model_path: Path, cli_cache: Path) -> None:
    report = json.loads(cli("plan", str(model_path), "--shape", "x=2,4,8,8", "--json", cache=cli_cache).stdout)
    names = [p["name"] for p in report["plans"]]
    assert {"cpu", "auto"} <= set(names) and set(names) <= {"cpu", "gpu", "hybrid", "auto"}
    node_count = len(skip_dag().graph.node)
    for plan in report["plans"]:
        assert sum(s["node_count"] for s in plan["stages"]) == node_count
        assert plan["est_ms"] == pytest.approx(sum(s["est_ms"] for s in plan["stages"]), rel=1e-3, abs=1e-3)
    (cpu,) = [p for p in report["plans"] if p["name"] == "cpu"]
    (stage,) = cpu["stages"]
    assert stage["backend"] == "cpu" and stage["copy_bytes"] == 0
    assert stage["inputs"] == [{"name": "x", "bytes": 2 * 4 * 8 * 8 * 4}]
    assert {t["name"]: t["bytes"] for t in stage["outputs"]} == {"logits": 2 * 5 * 4, "aux": 2 * 8 * 8 * 8 * 4}
    text = cli("plan", str(model_path), "--plan", "cpu", cache=cli_cache).stdout
    assert "plan cpu" in text and "x (1.0 KB)" in text  # batch 1 when no --shape binds it
    decision = report["auto_decision"]  # None only where no accelerator is in the backend order
    if decision is not None:
        assert decision["shapes"] == {"x": [2, 4, 8, 8]}
        by_name = {c["name"]: c for c in decision["candidates"]}
        assert by_name["cpu"]["est_ms"] > 0 and by_name["cpu"]["measured_ms"] > 0, "cpu is always timed"
        assert decision["winner"] in by_name and by_name[decision["winner"]]["measured_ms"] is not None
        assert "measured" in text or "auto, measured" in cli("plan", str(model_path), cache=cli_cache).stdout


def test_cli_run_plan_reports_the_plan_and_equals_onnxruntime(model_path: Path, tmp_path: Path,
                                                             cli_cache: Path) -> None:
    x = np.random.default_rng(3).standard_normal((3, 4, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    report = json.loads(cli("run", str(model_path), "--plan", "cpu", "--input", f"x={tmp_path / 'x.npy'}",
                            "--output", str(tmp_path / "out.npz"), "--repeat", "1", "--json", cache=cli_cache).stdout)
    assert report["plan"]["name"] == "cpu" and [s["backend"] for s in report["plan"]["stages"]] == ["cpu"]
    assert report["backend_nodes"] == {"cpu": len(skip_dag().graph.node)}
    got = dict(np.load(tmp_path / "out.npz"))
    assert_close_to(got, ort_outputs(skip_dag(), {"x": x}))


def test_cli_backend_and_plan_together_is_a_usage_error(model_path: Path, cli_cache: Path) -> None:
    result = cli("run", str(model_path), "--backend", "cpu", "--plan", "gpu", cache=cli_cache, check=False)
    assert result.returncode == 2 and "not both" in result.stderr


@pytest.mark.requires_opencl
@needs_ocr
def test_cli_backend_auto_runs_a_mixed_opencl_plan_on_a_real_model(opencl_backend: Any, tmp_path: Path) -> None:
    """The calibration cache is edited so OpenCL looks fast at compute but slow on memory and
    per run, the cpu the other way round: the cost model puts the middle of the model on
    OpenCL. The answer must still be ONNX Runtime's. (One model only: PoCL builds every
    kernel for each new shape, up to a minute for PP-OCR det.)"""
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.planning.calibration import CACHE_FILE
    from edge_runtime.runtime import Runtime

    kind, shape = "det", (1, 3, 64, 96)
    assert kind in OCR
    rt = Runtime(RuntimeConfig(cache_dir=tmp_path))
    assert rt.accelerator() == "opencl"
    rt.backend_speed("cpu"), rt.backend_speed("opencl")  # writes the real calibration
    rt.close()
    from edge_runtime.planning.calibration_bounds import host_bandwidth_gbps

    host_gbps = host_bandwidth_gbps()  # bandwidth figures beyond 2x this are refused as impossible
    entries = json.loads((tmp_path / CACHE_FILE).read_text())
    for key, entry in entries.items():
        if key.startswith("opencl|"):
            entry.update(gflops=1e3, conv_gflops=1e3, mem_gbps=1.0, launch_us=1.0, stage_us=3000.0,
                         copy_gbps=host_gbps, copy_latency_us=0.1)
        else:  # a cpu slow at compute: the conv-heavy middle of the model pays for the move
            entry.update(gflops=2.0, conv_gflops=2.0, mem_gbps=host_gbps, launch_us=1.0, stage_us=1.0)
    (tmp_path / CACHE_FILE).write_text(json.dumps(entries))
    # Measured, auto would keep PoCL out; the stored verdict says the estimate's plan won.
    from edge_runtime.plan_choice import CACHE_FILE as CHOICE_FILE, decision_key

    proto = onnx.load(str(OCR[kind]))
    key = decision_key(rt, proto, {"x": shape}, rt.compile_options())
    (tmp_path / CHOICE_FILE).write_text(json.dumps({key: {
        "winner": "auto", "kind": "plan", "reason": "stored", "shapes": {"x": list(shape)},
        "candidates": [{"name": "auto", "kind": "plan", "backends": ["opencl", "cpu"], "est_ms": 1.0,
                        "measured_ms": 1.0}]}}))
    x = np.random.default_rng(1).random(shape, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    report = json.loads(cli("run", str(OCR[kind]), "--backend", "auto", "--input", f"x={tmp_path / 'x.npy'}",
                            "--output", str(tmp_path / "out.npz"), "--repeat", "1", "--json", cache=tmp_path).stdout)
    assert report["plan"]["name"] == "auto"
    assert set(report["backend_nodes"]) == {"opencl", "cpu"}, report["plan"]
    assert sum(report["backend_nodes"].values()) == len(onnx.load(str(OCR[kind])).graph.node)
    want = ort_outputs(onnx.load(str(OCR[kind])), {"x": x})
    got = dict(np.load(tmp_path / "out.npz"))
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
