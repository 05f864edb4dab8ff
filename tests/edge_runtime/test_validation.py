"""Every bad-input case raises InvalidInputError naming the tensor, expected and received value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_runtime.errors import InvalidInputError


@pytest.fixture(scope="module")
def mobilenet(runtime, model_dir: Path):
    return runtime.load(model_dir / "mobilenet.onnx", backend="cpu")


def good(batch: int = 1) -> np.ndarray:
    return np.zeros((batch, 3, 64, 64), np.float32)


@pytest.mark.parametrize("feeds,pattern", [
    ({"image": good()}, r"unknown input\(s\) \['image'\].*\['input'\]"),
    ({}, r"missing input\(s\) \['input'\]"),
    ({"input": good().astype(np.float64)}, r"'input': expected dtype float32, got float64"),
    ({"input": good()[0]}, r"'input': expected rank 4 .*got rank 3 \(shape \[3, 64, 64\]\)"),
    ({"input": np.zeros((1, 4, 64, 64), np.float32)}, r"'input': dimension 1 must be 3 .*got 4"),
    ({"input": np.zeros((1, 3, 64, 32), np.float32)}, r"'input': dimension 3 must be 64 .*got 32"),
    ({"input": "a string"}, r"'input': expected a numpy array of float32, got str"),
])
def test_bad_feed_is_rejected_before_the_backend(mobilenet, feeds: dict, pattern: str) -> None:
    runs_before = _session_runs(mobilenet)
    with pytest.raises(InvalidInputError, match=pattern):
        mobilenet.run(feeds)
    assert _session_runs(mobilenet) == runs_before


def test_dynamic_batch_accepts_any_size(mobilenet) -> None:
    for batch in (1, 2, 5):
        assert mobilenet.run({"input": good(batch)})["probabilities"].shape == (batch, 10)


def test_feeds_must_be_a_mapping(mobilenet) -> None:
    with pytest.raises(InvalidInputError, match="mapping"):
        mobilenet.run([good()])


def test_symbolic_dimension_must_agree_across_inputs() -> None:
    from backends.base import TensorSpec
    from edge_runtime.validation import validate_feeds

    specs = [TensorSpec("a", "float32", ("batch", 2)), TensorSpec("b", "float32", ("batch", 3))]
    with pytest.raises(InvalidInputError, match=r"'b': dimension 0 \('batch'\) is 4, but input 'a' bound 'batch' to 2"):
        validate_feeds(specs, {"a": np.zeros((2, 2), np.float32), "b": np.zeros((4, 3), np.float32)})


def _session_runs(model) -> int:
    # The cpu executable counts nothing itself; wrap run to observe calls instead.
    return getattr(model.executable, "_observed_runs", 0)


@pytest.fixture(autouse=True)
def _observe_runs(mobilenet, monkeypatch: pytest.MonkeyPatch):
    executable = mobilenet.executable
    original = executable.run

    def counting_run(feeds):
        executable._observed_runs = getattr(executable, "_observed_runs", 0) + 1
        return original(feeds)

    monkeypatch.setattr(executable, "run", counting_run)
    yield
