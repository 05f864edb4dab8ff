"""Quantized models: int8/uint8 I/O, their (scale, zero_point), and optional automatic (de)quantization."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from backends.base import CompileOptions, TensorSpec
from backends.errors import InvalidInputError
from backends.tflite import TFLiteBackend

pytestmark = pytest.mark.requires_litert

INPUT = {"int8": "image", "uint8": "image_uint8"}
OUTPUT = {"int8": "probs", "uint8": "probs_uint8"}


def _litert_quantization(model: Path) -> dict[str, tuple[float, int]]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(model))
    details = interpreter.get_input_details() + interpreter.get_output_details()
    return {d["name"]: (float(d["quantization"][0]), int(d["quantization"][1])) for d in details}


def _quantize(x: np.ndarray, scale: float, zero_point: int, dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(np.round(x / scale) + zero_point, info.min, info.max).astype(dtype)


@pytest.mark.parametrize("io_dtype", ["int8", "uint8"])
def test_quantization_parameters_are_exposed(io_dtype: str, tflite_models: dict[str, Path]) -> None:
    model = tflite_models[f"{io_dtype}_cnn"]
    executable = TFLiteBackend().compile(model, CompileOptions(intra_op_threads=1))
    expected = _litert_quantization(model)
    assert set(executable.quantization) == set(expected) == {INPUT[io_dtype], OUTPUT[io_dtype]}
    for name, (scale, zero_point) in expected.items():
        assert executable.quantization[name][0] == pytest.approx(scale)
        assert executable.quantization[name][1] == zero_point
    assert executable.describe()["quantization"] == {k: list(v) for k, v in executable.quantization.items()}
    assert executable.inputs == [TensorSpec(INPUT[io_dtype], io_dtype, (1, 16, 16, 3))]
    assert executable.outputs == [TensorSpec(OUTPUT[io_dtype], io_dtype, (1, 10))]


@pytest.mark.aarch64
@pytest.mark.parametrize("io_dtype", ["int8", "uint8"])
def test_quantized_outputs_equal_plain_litert(io_dtype: str, tflite_models: dict[str, Path],
                                              litert_oracle: Callable, image: Callable) -> None:
    model = tflite_models[f"{io_dtype}_cnn"]
    executable = TFLiteBackend().compile(model, CompileOptions(intra_op_threads=2))
    scale, zero_point = _litert_quantization(model)[INPUT[io_dtype]]
    for seed in range(3):
        q = _quantize(image((1, 16, 16, 3), seed), scale, zero_point, io_dtype)
        got = executable.run({INPUT[io_dtype]: q})[OUTPUT[io_dtype]]
        expected = litert_oracle(model, {INPUT[io_dtype]: q}, threads=2)[OUTPUT[io_dtype]]
        assert got.dtype == np.dtype(io_dtype)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("io_dtype", ["int8", "uint8"])
def test_auto_quantize_takes_and_gives_floats(io_dtype: str, tflite_models: dict[str, Path],
                                              litert_oracle: Callable, image: Callable) -> None:
    model = tflite_models[f"{io_dtype}_cnn"]
    params = _litert_quantization(model)
    executable = TFLiteBackend().compile(model, CompileOptions(intra_op_threads=1))
    executable.auto_quantize = True
    assert executable.inputs == [TensorSpec(INPUT[io_dtype], "float32", (1, 16, 16, 3))]
    assert executable.outputs == [TensorSpec(OUTPUT[io_dtype], "float32", (1, 10))]
    x = image((1, 16, 16, 3), 11)
    q = _quantize(x, *params[INPUT[io_dtype]], io_dtype)
    raw = litert_oracle(model, {INPUT[io_dtype]: q})[OUTPUT[io_dtype]]
    out_scale, out_zero = params[OUTPUT[io_dtype]]
    got = executable.run({INPUT[io_dtype]: x})[OUTPUT[io_dtype]]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, (raw.astype(np.float64) - out_zero) * out_scale, rtol=1e-6)
    # Already-quantized feeds pass through untouched.
    np.testing.assert_allclose(executable.run({INPUT[io_dtype]: q})[OUTPUT[io_dtype]], got, rtol=0)


def test_float_feed_without_auto_quantize_is_refused(tflite_models: dict[str, Path], image: Callable) -> None:
    executable = TFLiteBackend().compile(tflite_models["int8_cnn"], CompileOptions(intra_op_threads=1))
    with pytest.raises(InvalidInputError) as info:
        executable.run({"image": image((1, 16, 16, 3), 0)})
    message = str(info.value)
    assert "'image': expected dtype int8" in message and "got float32" in message
    assert "scale=0.0078125 zero_point=0" in message and "auto_quantize" in message


def test_auto_quantize_saturates_out_of_range_floats(tflite_models: dict[str, Path],
                                                     litert_oracle: Callable) -> None:
    model = tflite_models["int8_cnn"]
    executable = TFLiteBackend().compile(model, CompileOptions(intra_op_threads=1))
    executable.auto_quantize = True
    x = np.full((1, 16, 16, 3), 5.0, np.float32)  # far above the input range [-1, 1)
    saturated = np.full((1, 16, 16, 3), 127, np.int8)
    scale, zero_point = _litert_quantization(model)["probs"]
    expected = (litert_oracle(model, {"image": saturated})["probs"].astype(np.float64) - zero_point) * scale
    np.testing.assert_allclose(executable.run({"image": x})["probs"], expected, rtol=1e-6)
