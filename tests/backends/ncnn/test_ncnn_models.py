"""Real and model-zoo CNNs through ``--backend ncnn`` equal ONNX Runtime within 1e-4 relative.

PP-OCR det/cls/rec come from the rapidocr-onnxruntime wheel (read as files,
found as in tests/edge_runtime/test_real_models.py); the zoo models are
built from fixed seeds. Oracle: plain ONNX Runtime on the original model.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from edge_runtime.model_zoo import build_mlp, build_mobilenet, build_transformer
from ncnn_helpers import assert_close, ort_outputs
from ocr_models import ocr_models

pytestmark = pytest.mark.requires_ncnn

OCR = ocr_models()

# Two shapes of one kind exercise two shape buckets of one loaded model.
OCR_CASES = [("cls", [(3, 3, 48, 192)]), ("det", [(1, 3, 96, 160), (1, 3, 64, 64)]),
             ("rec", [(1, 3, 48, 160), (2, 3, 48, 96)])]


@pytest.mark.skipif(not OCR and os.environ.get("CI") != "true",
                    reason="rapidocr-onnxruntime (test extra) is not installed")
@pytest.mark.parametrize("kind,shapes", OCR_CASES, ids=[c[0] for c in OCR_CASES])
def test_ppocr_models_on_ncnn_equal_onnxruntime(make_runtime, kind: str, shapes: list) -> None:
    assert kind in OCR, f"PP-OCR {kind} model not found in rapidocr_onnxruntime"
    model = make_runtime().load(OCR[kind], backend="ncnn")
    assert model.backend == "ncnn"
    name = model.inputs[0].name
    for shape in shapes:
        x = np.random.default_rng(0).random(shape, dtype=np.float32)
        got = model.run({name: x})
        for spec, want in zip(model.outputs, ort_outputs(OCR[kind], {name: x})):
            assert_close(got[spec.name], want)
    described = model.describe()["executable"]
    assert described["on_onnxruntime"] == []
    assert sorted(b["input_shapes"][0] for b in described["buckets"]) == sorted(list(s[1:]) for s in shapes)
    assert all(b["worst_error"] <= 1e-4 for b in described["buckets"])


@pytest.mark.parametrize("build,batch", [(build_mobilenet, 3), (build_mlp, 2), (build_transformer, 2)],
                         ids=["mobilenet", "mlp", "transformer"])
def test_zoo_models_on_ncnn_equal_onnxruntime(make_runtime, tmp_path, build, batch: int) -> None:
    proto = build()
    path = tmp_path / "model.onnx"
    onnx.save(proto, str(path))
    model = make_runtime().load(path, backend="ncnn")
    spec = model.inputs[0]
    shape = [batch, *[int(d) for d in spec.shape[1:]]]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    got = model.run({spec.name: x})
    for out, want in zip(model.outputs, ort_outputs(proto, {spec.name: x})):
        assert_close(got[out.name], want)
    assert model.backend_nodes == {"ncnn": len(proto.graph.node)}


def test_fp16_only_when_configured(make_runtime, tmp_path) -> None:
    """fp32 by default; fp16 storage is a separate conversion held to the looser fp16 tolerance."""
    import dataclasses

    proto = build_mobilenet()
    path = tmp_path / "model.onnx"
    onnx.save(proto, str(path))
    rt = make_runtime()
    fp32 = rt.load(path, backend="ncnn")
    fp16 = rt.load(path, backend="ncnn", options=dataclasses.replace(rt.compile_options(), precision="fp16"))
    d32, d16 = fp32.describe()["executable"], fp16.describe()["executable"]
    assert (d32["precision"], d16["precision"]) == ("fp32", "fp16")
    assert d32["buckets"][0]["folder"] != d16["buckets"][0]["folder"]
    x = np.random.default_rng(2).standard_normal((1, 3, 64, 64)).astype(np.float32)
    want = ort_outputs(proto, {"input": x})[0]
    np.testing.assert_allclose(fp16.run({"input": x})["probabilities"], want, atol=2e-2)
    assert_close(fp32.run({"input": x})["probabilities"], want)
