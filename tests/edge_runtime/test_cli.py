"""The CLI contract: spellings and JSON fields other tools rely on (run as real subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cache: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGE_RUNTIME_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "edge_runtime", *args], capture_output=True, text=True,
                            env=env, timeout=240)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_run_json_reports_latency_nodes_and_outputs(model_dir: Path, tmp_path: Path) -> None:
    result = cli("run", str(model_dir / "mobilenet.onnx"), "--backend", "cpu", "--repeat", "3", "--json",
                 cache=tmp_path)
    report = json.loads(result.stdout)
    assert set(report["latency_ms"]) >= {"p50", "p95", "mean"}
    assert report["latency_ms"]["n"] == 3
    import onnx

    assert report["backend_nodes"] == {"cpu": len(onnx.load(str(model_dir / "mobilenet.onnx")).graph.node)}
    # dynamic batch becomes 1
    assert report["outputs"] == {"probabilities": {"shape": [1, 10], "dtype": "float32"}}


def test_run_with_input_file_writes_outputs_equal_to_onnxruntime(model_dir: Path, tmp_path: Path) -> None:
    x = np.random.default_rng(7).standard_normal((4, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    cli("run", str(model_dir / "mlp.onnx"), "--input", f"input={tmp_path / 'x.npy'}",
        "--output", str(tmp_path / "out.npz"), "--repeat", "1", cache=tmp_path)
    expected = ort.InferenceSession(str(model_dir / "mlp.onnx")).run(None, {"input": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["logits"], expected, rtol=1e-4, atol=1e-5)


def test_run_bad_input_file_is_a_clear_error_not_a_traceback(model_dir: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((2, 63), np.float32))
    result = cli("run", str(model_dir / "mlp.onnx"), "--input", f"input={tmp_path / 'x.npy'}",
                 cache=tmp_path, check=False)
    assert result.returncode == 1
    assert "'input': dimension 1 must be 64" in result.stderr
    assert "Traceback" not in result.stderr


def test_run_missing_model_exits_1_naming_it(tmp_path: Path) -> None:
    result = cli("run", str(tmp_path / "absent.onnx"), cache=tmp_path, check=False)
    assert result.returncode == 1 and "absent.onnx" in result.stderr


@pytest.mark.aarch64
def test_probe_json_is_the_profile_and_its_match(tmp_path: Path) -> None:
    report = json.loads(cli("probe", "--json", cache=tmp_path).stdout)
    assert report["profile"]["cpu"]["usable_cores"] >= 1
    assert report["match"]["backend_order"][-1] == "cpu" or "cpu" in report["match"]["backend_order"]
    text = cli("probe", cache=tmp_path).stdout
    assert report["match"]["name"] in text


def test_demo_table_compares_every_backend_with_onnxruntime(tmp_path: Path) -> None:
    result = cli("demo", "--repeat", "3", "--json", cache=tmp_path)
    report = json.loads(result.stdout)
    rows = {row["backend"]: row for row in report["rows"]}
    assert "onnxruntime (baseline)" in rows and "cpu" in rows
    assert rows["cpu"]["max_abs_diff_vs_onnxruntime"] < 1e-5
    assert report["auto_backend"] in rows
    assert (tmp_path / "models").is_dir(), "the demo model is built locally and cached"
    generation = report["generation"]  # the decoder is built without torch, like the CNN
    assert generation["decode_tokens_per_s"] > 0 and generation["prompt_tokens"] > 0
    vision = report["vision"]  # a tiny VLM, also built without torch: one screenshot step
    assert 0 < vision["image_tokens"] < vision["prompt_tokens"]
    assert vision["timings_ms"]["vision_encode_ms"] > 0 and vision["timings_ms"]["first_token_ms"] > 0


@pytest.mark.parametrize("argv", [["run"], ["bogus"], ["run", "m.onnx", "--input", "no-equals-sign"]])
def test_usage_errors_exit_2(argv: list[str], tmp_path: Path) -> None:
    assert cli(*argv, cache=tmp_path, check=False).returncode == 2


@pytest.mark.requires_litert
def test_run_tflite_with_a_missing_delegate_runs_on_cpu_and_says_why(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    from make_tflite_models import main as make_tflite

    make_tflite([str(tmp_path / "tfl")])
    model = tmp_path / "tfl" / "float_cnn.tflite"
    missing = tmp_path / "libabsent_gpu_delegate.so"
    report = json.loads(cli("run", str(model), "--backend", "tflite", "--delegate", str(missing),
                            "--delegate-option", "precision=fp16", "--repeat", "2", "--json", cache=tmp_path).stdout)
    delegate = report["load"]["executable"]["delegate"]
    assert report["backend"] == "tflite"
    assert delegate["loaded"] is False and str(missing) in delegate["error"]
    assert delegate["options"]["precision"] == "fp16"
    assert report["outputs"]["probs"]["shape"] == [1, 10]


@pytest.mark.aarch64
@pytest.mark.parametrize("unbuffered", ["", "1"])  # the closed pipe surfaces at exit's flush / inside print
def test_stdout_closed_by_its_reader_exits_141_quietly(unbuffered: str, tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte: every write gets EPIPE
    env = {**os.environ, "EDGE_RUNTIME_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT),
           "PYTHONUNBUFFERED": unbuffered}
    try:
        result = subprocess.run([sys.executable, "-m", "edge_runtime", "probe", "--json"], stdout=write_end,
                                stderr=subprocess.PIPE, text=True, env=env, timeout=240)
    finally:
        os.close(write_end)
    assert result.returncode == 141, result.stderr
    assert result.stderr == ""
