"""Multi-signature models: named entry points, on every variant."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from backends.base import CompileOptions, DelegateSpec, TensorSpec
from backends.errors import InvalidInputError
from backends.tflite import TFLiteBackend

pytestmark = pytest.mark.requires_litert


def _feeds(seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    combine = {"a": rng.normal(size=(2, 3)).astype(np.float32), "b": rng.normal(size=(2, 3)).astype(np.float32)}
    return combine, {"x": rng.normal(size=4).astype(np.float32)}


def test_signatures_are_named_entry_points(tflite_models: dict[str, Path], litert_oracle: Callable) -> None:
    model = tflite_models["two_signatures"]
    executable = TFLiteBackend().compile(model, CompileOptions(intra_op_threads=1))
    assert executable.signatures == ("combine", "affine")
    inputs, outputs = executable.signature_specs("affine")
    assert inputs == [TensorSpec("x", "float32", (4,))] and outputs == [TensorSpec("y", "float32", (4,))]
    assert executable.describe()["signatures"]["combine"] == {"inputs": ["a", "b"], "outputs": ["product", "sum"]}
    combine, affine = _feeds(0)
    for signature, feeds in (("combine", combine), ("affine", affine)):
        got = executable.run(feeds, signature=signature)
        expected = litert_oracle(model, feeds, signature=signature)
        assert got.keys() == expected.keys()
        for name in got:
            np.testing.assert_array_equal(got[name], expected[name])
    np.testing.assert_allclose(executable.run(affine, signature="affine")["y"], 3 * affine["x"] + 1, rtol=1e-6)


def test_primary_entry_still_runs_between_signature_runs(tflite_models: dict[str, Path]) -> None:
    executable = TFLiteBackend().compile(tflite_models["two_signatures"], CompileOptions(intra_op_threads=1))
    combine, affine = _feeds(1)
    executable.run(affine, signature="affine")
    got = executable.run({"combine_a": combine["a"], "combine_b": combine["b"]})
    np.testing.assert_allclose(got["combine_sum"], combine["a"] + combine["b"], rtol=1e-6)
    np.testing.assert_allclose(executable.run(affine, signature="affine")["y"], 3 * affine["x"] + 1, rtol=1e-6)


def test_signatures_run_on_the_delegate_variant(tflite_models: dict[str, Path], delegate_library: Path,
                                                tmp_path: Path) -> None:
    log = tmp_path / "d.log"
    spec = DelegateSpec(str(delegate_library), (("log_path", str(log)), ("claim", "ADD")))
    executable = TFLiteBackend().compile(tflite_models["two_signatures"],
                                         CompileOptions(intra_op_threads=1, delegates=(spec,)))
    _, affine = _feeds(2)
    before = log.read_text().count("invoke")
    got = executable.run(affine, signature="affine", variant="delegate")
    np.testing.assert_allclose(got["y"], 3 * affine["x"] + 1, rtol=1e-6)
    assert log.read_text().count("invoke") == before + 1  # affine's ADD ran in the delegate


@pytest.mark.parametrize("signature, feeds, message", [
    ("nope", {}, "unknown signature 'nope'; the model has ['combine', 'affine']"),
    ("affine", {"y": np.zeros(4, np.float32)}, "signature 'affine' has no input(s) ['y']"),
    ("affine", {"x": np.zeros(5, np.float32)}, "'x': expected shape [4], got [5]"),
])
def test_bad_signature_calls_are_named(signature: str, feeds: dict, message: str,
                                       tflite_models: dict[str, Path]) -> None:
    executable = TFLiteBackend().compile(tflite_models["two_signatures"], CompileOptions(intra_op_threads=1))
    with pytest.raises(InvalidInputError) as info:
        executable.run(feeds, signature=signature)
    assert message in str(info.value)
