"""Warm starts of the ``cpu`` backend: the optimised-graph cache, its keys and its failure modes.

Assertions are on ``from_cache`` and on files, never on time. The oracle for
every answer is a plain ONNX Runtime session on the original model.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from backends.base import CompileOptions
from backends.cpu import CPUBackend
from edge_runtime.model_zoo import build_mlp


def plain(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


@pytest.fixture
def x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)


def load(model: onnx.ModelProto, cache: Path, extra: str = "device-A"):
    return CPUBackend().compile(model, CompileOptions(intra_op_threads=1, cache_dir=cache, cache_key_extra=extra))


def cached_files(cache: Path) -> list[Path]:
    return sorted((cache / "cpu").glob("*.onnx"))


def test_second_load_reads_the_optimised_graph_and_answers_the_same(tmp_path: Path, x: np.ndarray) -> None:
    model = build_mlp()
    first = load(model, tmp_path)
    assert not first.from_cache and len(cached_files(tmp_path)) == 1
    second = load(model, tmp_path)
    assert second.from_cache
    np.testing.assert_allclose(second.run({"input": x})["logits"], plain(model, x), rtol=1e-5, atol=1e-6)


def test_a_changed_model_device_or_library_misses_the_cache(tmp_path: Path, x: np.ndarray,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    model = build_mlp(seed=0)
    load(model, tmp_path)
    other = build_mlp(seed=1)  # same graph, other weights: another hash
    changed = load(other, tmp_path)
    assert not changed.from_cache
    np.testing.assert_allclose(changed.run({"input": x})["logits"], plain(other, x), rtol=1e-5, atol=1e-6)
    assert not load(model, tmp_path, extra="device-B").from_cache
    monkeypatch.setattr(ort, "__version__", ort.__version__ + ".post-upgrade")  # a library upgrade
    assert not load(model, tmp_path).from_cache
    assert len(cached_files(tmp_path)) == 4
    monkeypatch.undo()
    assert load(model, tmp_path).from_cache


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_corrupt_cache_entry_is_ignored_with_a_warning_and_rebuilt(damage: str, tmp_path: Path, x: np.ndarray,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    model = build_mlp()
    load(model, tmp_path)
    (entry,) = cached_files(tmp_path)
    blob = entry.read_bytes()
    entry.write_bytes({"truncated": blob[: len(blob) // 3], "garbage": b"\x00\xffnot onnx" * 50, "empty": b""}[damage])
    with caplog.at_level(logging.WARNING, logger="backends.cpu"):
        rebuilt = load(model, tmp_path)
    assert not rebuilt.from_cache and "unusable" in caplog.text
    np.testing.assert_allclose(rebuilt.run({"input": x})["logits"], plain(model, x), rtol=1e-5, atol=1e-6)
    assert load(model, tmp_path).from_cache  # rewritten whole


def test_an_unwritable_cache_is_ignored_with_a_warning(tmp_path: Path, x: np.ndarray,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache folder should be")
    model = build_mlp()
    with caplog.at_level(logging.WARNING, logger="backends.cpu"):
        executable = load(model, blocker)
    assert "not writable" in caplog.text and not executable.from_cache
    np.testing.assert_allclose(executable.run({"input": x})["logits"], plain(model, x), rtol=1e-5, atol=1e-6)
