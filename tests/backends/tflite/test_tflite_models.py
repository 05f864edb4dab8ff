"""The hand-written flatbuffer models: LiteRT reads them as the numpy maths says they are."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import make_tflite_models

pytestmark = pytest.mark.requires_litert


def _same_padded(x: np.ndarray, kernel: int, stride: int) -> tuple[np.ndarray, int, int]:
    """TF "SAME" padding (the extra row/column goes bottom/right)."""
    out_h, out_w = -(-x.shape[1] // stride), -(-x.shape[2] // stride)
    pad_h = max((out_h - 1) * stride + kernel - x.shape[1], 0)
    pad_w = max((out_w - 1) * stride + kernel - x.shape[2], 0)
    padded = np.pad(x, ((0, 0), (pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    return padded, out_h, out_w


def _conv(x: np.ndarray, w_ohwi: np.ndarray, b: np.ndarray, stride: int, depthwise: bool) -> np.ndarray:
    kernel = w_ohwi.shape[1]
    padded, out_h, out_w = _same_padded(x, kernel, stride)
    out = np.zeros((x.shape[0], out_h, out_w, b.size))
    for ky in range(kernel):
        for kx in range(kernel):
            patch = padded[:, ky:ky + stride * out_h:stride, kx:kx + stride * out_w:stride, :]
            out += patch * w_ohwi[0, ky, kx, :] if depthwise else patch @ w_ohwi[:, ky, kx, :].T
    return out + b


def numpy_float_cnn(weights: dict[str, np.ndarray], image: np.ndarray) -> np.ndarray:
    """The float CNN written out in float64 numpy: the independent oracle for the model file."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    relu6 = np.clip(_conv(image.astype(np.float64), w["conv_w"], w["conv_b"], 2, False), 0, 6)
    dw = _conv(relu6, w["dw_w"], w["dw_b"], 1, True)
    hswish = dw * np.clip(dw + 3, 0, 6) / 6
    pooled = (relu6 + hswish).mean(axis=(1, 2))
    logits = pooled @ w["fc_w"].T + w["fc_b"] + w["logit_bias"]
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


@pytest.mark.aarch64
def test_float_cnn_matches_numpy(tflite_models: dict[str, Path], litert_oracle: Callable,
                                 image: Callable) -> None:
    x = image((1, 16, 16, 3), 3)
    got = litert_oracle(tflite_models["float_cnn"], {"image": x})["probs"]
    expected = numpy_float_cnn(make_tflite_models.cnn_weights(0), x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)


def test_float_cnn_has_the_listed_ops(tflite_models: dict[str, Path]) -> None:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(model_path=str(tflite_models["float_cnn"]),
                              experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    names = [op["op_name"] for op in interpreter._get_ops_details()]
    assert names == ["CONV_2D", "RELU6", "DEPTHWISE_CONV_2D", "HARD_SWISH", "ADD", "AVERAGE_POOL_2D",
                     "RESHAPE", "FULLY_CONNECTED", "ADD", "SOFTMAX"]


@pytest.mark.aarch64
@pytest.mark.parametrize("io_dtype", ["int8", "uint8"])
def test_quantized_cnn_approximates_the_float_model(io_dtype: str, tflite_models: dict[str, Path],
                                                    litert_oracle: Callable, image: Callable) -> None:
    from ai_edge_litert.interpreter import Interpreter

    path = tflite_models[f"{io_dtype}_cnn"]
    interpreter = Interpreter(model_path=str(path))
    (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
    assert np.dtype(inp["dtype"]).name == io_dtype and np.dtype(out["dtype"]).name == io_dtype
    in_scale, in_zero = inp["quantization"]
    out_scale, out_zero = out["quantization"]
    for seed in range(4):
        x = image((1, 16, 16, 3), seed)
        info = np.iinfo(io_dtype)
        q = np.clip(np.round(x / in_scale) + in_zero, info.min, info.max).astype(io_dtype)
        got = (litert_oracle(path, {inp["name"]: q})[out["name"]].astype(np.float64) - out_zero) * out_scale
        expected = litert_oracle(tflite_models["float_cnn"], {"image": x})["probs"]
        np.testing.assert_allclose(got, expected, atol=0.03)


def test_two_signature_model(tflite_models: dict[str, Path], litert_oracle: Callable) -> None:
    rng = np.random.default_rng(7)
    a, b = rng.normal(size=(2, 3)).astype(np.float32), rng.normal(size=(2, 3)).astype(np.float32)
    x = rng.normal(size=4).astype(np.float32)
    combine = litert_oracle(tflite_models["two_signatures"], {"a": a, "b": b}, signature="combine")
    affine = litert_oracle(tflite_models["two_signatures"], {"x": x}, signature="affine")
    np.testing.assert_allclose(combine["sum"], a + b, rtol=1e-6)
    np.testing.assert_allclose(combine["product"], a * b, rtol=1e-6)
    np.testing.assert_allclose(affine["y"], 3 * x + 1, rtol=1e-6)
