"""Quantized models on every plan: the three conversions, and models that arrive quantized.

Oracles: plain ONNX Runtime sessions opened here (never the runtime's own
``cpu`` backend), and the drift the conversion report states.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.quantization import QuantFormat, quantize_static

from edge_runtime.optimize.calibration import SampleReader, seeded_samples
from edge_runtime.optimize.workflow import convert

PLANS = ("cpu", "gpu", "hybrid", "auto")


def plain_ort(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def feeds_for(seed: int) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)}


@pytest.mark.requires_opencl
@pytest.mark.parametrize("mode", ["dynamic", "static", "fp16"])
def test_converted_models_run_on_every_plan_within_the_reported_drift(mode: str, cnn_path: Path, tmp_path: Path,
                                                                     offloading_runtime: Any) -> None:
    out = tmp_path / f"cnn_{mode}.onnx"
    report = convert(offloading_runtime, cnn_path, out, mode, plans=PLANS, seeded_count=6, rounds=1,
                     runs_per_round=1)
    assert report.plan_errors == ()
    assert [s.plan for s in report.speed] == list(PLANS)
    (drift,) = report.drift
    # The report's own numbers, checked against plain ONNX Runtime on the same seeded samples.
    samples = seeded_samples(offloading_runtime.load(cnn_path, backend="cpu").inputs, 6)
    errors = [np.abs(plain_ort(cnn_path, s)["logits"] - plain_ort(out, s)["logits"]) for s in samples]
    assert drift.max_abs == pytest.approx(max(float(e.max()) for e in errors), rel=1e-5, abs=1e-7)
    assert drift.rows == 6
    for plan in PLANS:
        model = offloading_runtime.load(out, plan=plan)
        try:
            for sample in samples:
                got = model.run(sample)["logits"]
                want = plain_ort(cnn_path, sample)["logits"]
                # One quantization step may round the other way on another backend's floats.
                assert np.abs(got - want).max() <= 1.5 * drift.max_abs + 2e-3, (plan, mode)
        finally:
            model.close()


def _static(cnn_path: Path, out: Path, fmt: Any, nodes: list[str] | None) -> Path:
    """``quantize_static`` of the whole CNN, or only of ``nodes`` (a float tail stays for the accelerator)."""
    samples = seeded_samples(ort_specs(cnn_path), 4)
    quantize_static(str(cnn_path), str(out), SampleReader(samples), quant_format=fmt, nodes_to_quantize=nodes)
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert ("QLinearConv" if fmt == QuantFormat.QOperator else "DequantizeLinear") in ops
    return out


def ort_specs(path: Path) -> list[Any]:
    from backends.onnx_graph import graph_inputs

    return graph_inputs(onnx.load(str(path)))


# kind -> (builder, whether a plan must split it between opencl and cpu). A fully QDQ model is
# islands of one float node between Q/DQ pairs: no island pays for its copies, so it stays whole.
KINDS = {
    "conv_integer": (lambda cnn, ci, tmp: ci, True),
    "qdq_stem": (lambda cnn, ci, tmp: _static(cnn, tmp / "qdq_stem.onnx", QuantFormat.QDQ, ["stem"]), True),
    "qoperator_stem": (lambda cnn, ci, tmp: _static(cnn, tmp / "qop_stem.onnx", QuantFormat.QOperator, ["stem"]),
                       True),
    "qdq": (lambda cnn, ci, tmp: _static(cnn, tmp / "qdq.onnx", QuantFormat.QDQ, None), False),
    "qoperator": (lambda cnn, ci, tmp: _static(cnn, tmp / "qop.onnx", QuantFormat.QOperator, None), False),
}


@pytest.mark.requires_opencl
@pytest.mark.parametrize("kind", list(KINDS))
def test_prequantized_models_equal_plain_onnxruntime_on_cpu_and_mixed_plans(
        kind: str, cnn_path: Path, conv_integer_path: Path, tmp_path: Path, offloading_runtime: Any) -> None:
    build, must_split = KINDS[kind]
    path = build(cnn_path, conv_integer_path, tmp_path)
    mixed = False
    for plan in PLANS:
        model = offloading_runtime.load(path, plan=plan)
        try:
            for seed in range(3):
                feeds = feeds_for(seed)
                np.testing.assert_allclose(model.run(feeds)["logits"], plain_ort(path, feeds)["logits"],
                                           rtol=1e-4, atol=1e-4, err_msg=f"{kind} on plan {plan}")
            nodes = model.backend_nodes
            assert sum(nodes.values()) == len(onnx.load(str(path)).graph.node)
            if plan != "cpu":
                # The fallback is visible: the load report names the ops left on the host.
                assert "not claimed by the accelerator" in model.report.reason
                mixed = mixed or {"opencl", "cpu"} <= set(nodes)
        finally:
            model.close()
    assert mixed or not must_split, f"{kind}: no plan split the model between opencl and cpu"


def test_quantized_models_run_on_the_cpu_plan_without_an_accelerator(cnn_path: Path, tmp_path: Path,
                                                                     cpu_runtime: Any) -> None:
    path = _static(cnn_path, tmp_path / "qdq.onnx", QuantFormat.QDQ, None)
    for plan in ("cpu", "auto"):
        model = cpu_runtime.load(path, plan=plan)
        feeds = feeds_for(0)
        np.testing.assert_allclose(model.run(feeds)["logits"], plain_ort(path, feeds)["logits"], rtol=1e-5, atol=1e-5)
        model.close()


def test_the_speed_report_times_sessions_that_do_not_spin(cnn_path: Path, tmp_path: Path, cpu_runtime: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32 and int8 take turns in one process: a spinning idle session would steal the other's cores."""
    from edge_runtime.optimize import workflow

    spinning: dict[str, list[str]] = {}
    real_speed_report = workflow.speed_report

    def capture(pairs, *args, **kwargs):
        for plan, (reference, candidate) in pairs.items():
            spinning[plan] = []
            for run in (reference, candidate):  # bound Model.run of the models the report times
                (stage,) = run.__self__.executable.stages
                options = stage.executable._session.get_session_options()  # ORT's session behind the plan
                spinning[plan].append(options.get_session_config_entry("session.intra_op.allow_spinning"))
        return real_speed_report(pairs, *args, **kwargs)

    monkeypatch.setattr(workflow, "speed_report", capture)
    convert(cpu_runtime, cnn_path, tmp_path / "q.onnx", "dynamic", plans=["cpu"], seeded_count=2, rounds=1,
            runs_per_round=1)
    assert spinning == {"cpu": ["0", "0"]}
