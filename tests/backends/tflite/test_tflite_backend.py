"""The tflite backend without delegates: contract, equality with plain LiteRT, clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest

from backends.base import CompileOptions, TensorSpec, backend_nodes_of
from backends.errors import BackendError, InvalidInputError, ModelLoadError, ModelNotFoundError
from backends.tflite import TFLiteBackend

pytestmark = pytest.mark.requires_litert


def test_availability_names_the_runtime() -> None:
    availability = TFLiteBackend().availability()
    assert availability.ok
    assert "ai_edge_litert" in availability.reason or "tflite_runtime" in availability.reason


def test_takes_no_onnx_nodes() -> None:
    node = onnx.helper.make_node("Add", ["a", "b"], ["c"])
    assert TFLiteBackend().supports(node, {}) is False


def test_float_model_equals_plain_litert(tflite_models: dict[str, Path], litert_oracle: Callable,
                                         image: Callable) -> None:
    executable = TFLiteBackend().compile(tflite_models["float_cnn"], CompileOptions(intra_op_threads=2))
    assert executable.inputs == [TensorSpec("image", "float32", (1, 16, 16, 3))]
    assert executable.outputs == [TensorSpec("probs", "float32", (1, 10))]
    assert executable.variants == ("cpu",) and executable.delegate_status is None
    for seed in range(3):
        x = image((1, 16, 16, 3), seed)
        expected = litert_oracle(tflite_models["float_cnn"], {"image": x}, threads=2)
        got = executable.run({"image": x})
        np.testing.assert_array_equal(got["probs"], expected["probs"])
    executable.close()


def test_backend_nodes_and_describe(tflite_models: dict[str, Path]) -> None:
    executable = TFLiteBackend().compile(tflite_models["float_cnn"], CompileOptions(intra_op_threads=1))
    assert backend_nodes_of(executable, "tflite", -1) == {"tflite": 10}
    described = executable.describe()
    assert described["backend"] == "tflite" and described["threads"] == 1
    # XNNPACK takes the whole float model in one partition.
    assert described["xnnpack"]["cpu"] == {"nodes_delegated": 10, "partitions": 1, "total_nodes": 10,
                                           "low_coverage": False}


def test_compiles_from_bytes(tflite_models: dict[str, Path], image: Callable) -> None:
    data = tflite_models["float_cnn"].read_bytes()
    from_bytes = TFLiteBackend().compile(data, CompileOptions(intra_op_threads=1))
    from_path = TFLiteBackend().compile(tflite_models["float_cnn"], CompileOptions(intra_op_threads=1))
    x = image((1, 16, 16, 3), 9)
    np.testing.assert_array_equal(from_bytes.run({"image": x})["probs"], from_path.run({"image": x})["probs"])


@pytest.mark.parametrize("feeds, message", [
    ({}, "input 'image' is missing"),
    ({"image": np.zeros((1, 16, 16, 3), np.float32), "extra": np.zeros(1)}, "no input(s) ['extra']"),
    ({"image": np.zeros((1, 16, 16, 3), np.float64)}, "'image': expected dtype float32, got float64"),
    ({"image": np.zeros((1, 8, 16, 3), np.float32)}, "'image': expected shape [1, 16, 16, 3], got [1, 8, 16, 3]"),
    ({"image": np.zeros((16, 16, 3), np.float32)}, "'image': expected shape [1, 16, 16, 3], got [16, 16, 3]"),
])
def test_bad_feeds_are_named(feeds: dict, message: str, tflite_models: dict[str, Path]) -> None:
    executable = TFLiteBackend().compile(tflite_models["float_cnn"], CompileOptions(intra_op_threads=1))
    with pytest.raises(InvalidInputError) as info:
        executable.run(feeds)
    assert message in str(info.value)


def test_unknown_variant_is_named(tflite_models: dict[str, Path]) -> None:
    executable = TFLiteBackend().compile(tflite_models["float_cnn"], CompileOptions(intra_op_threads=1))
    with pytest.raises(InvalidInputError, match=r"unknown variant 'delegate'.*\['cpu'\]"):
        executable.run({"image": np.zeros((1, 16, 16, 3), np.float32)}, variant="delegate")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no model file"):
        TFLiteBackend().compile(tmp_path / "absent.tflite", CompileOptions())


def test_not_a_tflite_file(tmp_path: Path) -> None:
    path = tmp_path / "model.tflite"
    path.write_bytes(b"\x08\x07\x12\x04onnx-model-bytes")
    with pytest.raises(ModelLoadError, match="is not a TFLite flatbuffer"):
        TFLiteBackend().compile(path, CompileOptions())


def test_truncated_tflite_file(tflite_models: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "truncated.tflite"
    path.write_bytes(tflite_models["float_cnn"].read_bytes()[:200])
    with pytest.raises(ModelLoadError, match="LiteRT cannot load the model"):
        TFLiteBackend().compile(path, CompileOptions())


def test_onnx_models_are_refused() -> None:
    graph = onnx.helper.make_graph([], "empty", [], [])
    with pytest.raises(ModelLoadError, match="ONNX models go to the other backends"):
        TFLiteBackend().compile(onnx.helper.make_model(graph), CompileOptions())


def test_closed_executable_refuses_to_run(tflite_models: dict[str, Path]) -> None:
    executable = TFLiteBackend().compile(tflite_models["float_cnn"], CompileOptions(intra_op_threads=1))
    executable.close()
    executable.close()  # idempotent
    with pytest.raises(BackendError, match="closed"):
        executable.run({"image": np.zeros((1, 16, 16, 3), np.float32)})


def test_open_batch_dimension_follows_the_feed(tflite_models: dict[str, Path]) -> None:
    executable = TFLiteBackend().compile(tflite_models["dynamic_batch"], CompileOptions(intra_op_threads=1))
    assert executable.inputs[0] == TensorSpec("a", "float32", (None, 3))
    rng = np.random.default_rng(3)
    for batch in (2, 5, 1):
        a, b = (rng.normal(size=(batch, 3)).astype(np.float32) for _ in range(2))
        np.testing.assert_allclose(executable.run({"a": a, "b": b})["total"], a + b, rtol=1e-6)
    with pytest.raises(InvalidInputError, match=r"'a': expected shape \[None, 3\], got \[2, 4\]"):
        executable.run({"a": np.zeros((2, 4), np.float32), "b": np.zeros((2, 4), np.float32)})
