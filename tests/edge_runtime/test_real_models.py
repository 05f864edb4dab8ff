"""Real exported vision models with dynamic dims: PP-OCR det/cls/rec (Paddle → ONNX).

They ship inside the ``rapidocr-onnxruntime`` wheel (a test dependency); we
read the files without importing the package. Oracle: plain ONNX Runtime.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from ocr_models import ocr_models

pytestmark = pytest.mark.aarch64


OCR = ocr_models()
# (kind, input shape): OCR nets take any H/W that is a multiple of their stride.
CASES = [("det", (1, 3, 96, 160)), ("det", (2, 3, 64, 64)), ("cls", (3, 3, 48, 192)),
         ("rec", (1, 3, 48, 160)), ("rec", (2, 3, 48, 96))]


@pytest.mark.skipif(not OCR and __import__("os").environ.get("CI") != "true",
                    reason="rapidocr-onnxruntime (test extra) is not installed")
@pytest.mark.parametrize("kind,shape", CASES)
def test_real_ocr_model_runs_with_dynamic_dims_like_onnxruntime(runtime, kind: str, shape: tuple) -> None:
    assert kind in OCR, f"PP-OCR {kind} model not found in rapidocr_onnxruntime"
    model = runtime.load(OCR[kind], backend="auto")
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    session = ort.InferenceSession(str(OCR[kind]), providers=["CPUExecutionProvider"])
    expected = session.run(None, {session.get_inputs()[0].name: x})
    got = model.run({model.inputs[0].name: x})
    assert [o.name for o in model.outputs] == [o.name for o in session.get_outputs()]
    for out, want in zip(model.outputs, expected):
        np.testing.assert_allclose(got[out.name], want, rtol=1e-4, atol=1e-4)
