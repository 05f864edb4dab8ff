"""``edge-runtime quantize`` and ``edge-runtime profile`` through the real command line.

Oracles: plain ONNX Runtime sessions for the drift the report prints, the
model's own node list for the profile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGE_RUNTIME_CACHE": str(cache), "PYTHONPATH": str(ROOT), "EDGE_RUNTIME_THREADS": "2"}
    return subprocess.run([sys.executable, "-m", "edge_runtime", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def ort_logits(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0]


@pytest.fixture(scope="module")
def calibration(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("calib")
    rng = np.random.default_rng(7)
    for i in range(8):
        np.save(folder / f"sample_{i:02d}.npy", rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    return folder


@pytest.mark.parametrize("mode", ["static", "dynamic", "fp16"])
def test_quantize_writes_a_model_and_reports_its_true_drift(mode: str, cnn_path: Path, calibration: Path,
                                                           tmp_path: Path) -> None:
    out = tmp_path / f"q_{mode}.onnx"
    result = cli("quantize", str(cnn_path), "--mode", mode, "--out", str(out), "--calibration", str(calibration),
                 "--plan", "cpu", "--rounds", "1", "--json", cache=tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    expected_op = {"static": "QuantizeLinear", "dynamic": "DynamicQuantizeLinear", "fp16": "Cast"}[mode]
    assert expected_op in ops, ops
    if mode == "static":
        assert report["calibration_samples"] == 8
        assert "calibrating" in result.stderr  # the progress bar
    (drift,) = report["accuracy"]
    xs = [np.load(p) for p in sorted(calibration.glob("*.npy"))]
    want = np.concatenate([ort_logits(cnn_path, x) for x in xs])
    got = np.concatenate([ort_logits(out, x) for x in xs])
    assert drift["max_abs"] == pytest.approx(float(np.abs(want - got).max()), rel=1e-5, abs=1e-7)
    assert drift["mean_abs"] == pytest.approx(float(np.abs(want - got).mean()), rel=1e-4, abs=1e-7)
    assert drift["top1_agreement"] == pytest.approx(float(np.mean(want.argmax(1) == got.argmax(1))))
    assert [s["plan"] for s in report["speed"]] == ["cpu"]
    assert report["speed"][0]["reference_ms"] > 0 and report["speed"][0]["candidate_ms"] > 0


def test_quantize_refuses_bad_calibration_data_with_a_clear_error(cnn_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    np.save(folder / "x.npy", np.zeros((3, 16, 16), np.float32))  # rank 3, the model wants rank 4
    result = cli("quantize", str(cnn_path), "--mode", "static", "--out", str(tmp_path / "q.onnx"),
                 "--calibration", str(folder), "--plan", "cpu", cache=tmp_path / "cache")
    assert result.returncode == 1
    assert "x.npy" in result.stderr and "rank 3" in result.stderr and "Traceback" not in result.stderr
    missing = cli("quantize", str(cnn_path), "--mode", "static", "--out", str(tmp_path / "q.onnx"),
                  "--calibration", str(tmp_path / "nowhere"), cache=tmp_path / "cache")
    assert missing.returncode == 1 and "calibration folder not found" in missing.stderr
    usage = cli("quantize", str(cnn_path), "--mode", "int3", "--out", str(tmp_path / "q.onnx"), cache=tmp_path)
    assert usage.returncode == 2


def test_profile_lists_every_kernel_slowest_first(cnn_path: Path, tmp_path: Path) -> None:
    result = cli("profile", str(cnn_path), "--plan", "cpu", "--repeat", "3", "--json", cache=tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    profile = json.loads(result.stdout)
    ops = profile["ops"]
    times = [op["time_us"] for op in ops]
    assert times == sorted(times, reverse=True) and all(t >= 0 for t in times)
    assert {op["source"] for op in ops} == {"onnxruntime-profiler"}
    # ORT fuses Conv+Relu, so kernels are at most the model's nodes, and every Conv is one.
    model_ops = [n.op_type for n in onnx.load(str(cnn_path)).graph.node]
    assert sum(1 for op in ops if op["op_type"] in ("Conv", "FusedConv")) == model_ops.count("Conv")
    assert len(ops) <= len(model_ops)
    assert sum(op["share"] for op in ops) == pytest.approx(1.0, abs=1e-3)
    text = cli("profile", str(cnn_path), "--top", "2", cache=tmp_path / "cache")
    assert text.returncode == 0 and "share" in text.stdout


@pytest.mark.requires_opencl
def test_profile_on_a_mixed_plan_reports_opencl_kernels_from_events(conv_integer_path: Path, offloading_runtime) -> None:
    from edge_runtime.optimize.profiler import profile_model

    profile = profile_model(offloading_runtime, conv_integer_path, "gpu", repeat=2)
    sources = {(op.backend, op.source) for op in profile.ops}
    assert ("cpu", "onnxruntime-profiler") in sources and ("opencl", "opencl-events") in sources, sources
    assert {op.op_type for op in profile.ops if op.backend == "cpu"} >= {"ConvInteger", "DynamicQuantizeLinear"}
