"""One executable hammered from several threads: every result must equal the sequential oracle."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from backends.base import CompileOptions, DelegateSpec
from backends.tflite import TFLiteBackend

pytestmark = pytest.mark.requires_litert

THREADS = 6
RUNS_PER_THREAD = 30


def _hammer(job: Callable[[int, int], None]) -> None:
    """Run ``job(thread, i)`` RUNS_PER_THREAD times on THREADS threads released together."""
    start = threading.Barrier(THREADS)

    def worker(thread: int) -> None:
        start.wait()
        for i in range(RUNS_PER_THREAD):
            job(thread, i)

    with ThreadPoolExecutor(THREADS) as pool:
        for future in [pool.submit(worker, t) for t in range(THREADS)]:
            future.result()  # re-raises the first failure of that thread


def test_variants_from_many_threads(tflite_models: dict[str, Path], delegate_library: Path, tmp_path: Path,
                                    litert_oracle: Callable, image: Callable) -> None:
    model = tflite_models["float_cnn"]
    spec = DelegateSpec(str(delegate_library), (("log_path", str(tmp_path / "d.log")), ("claim", "ADD")))
    executable = TFLiteBackend().compile(model, CompileOptions(intra_op_threads=1, delegates=(spec,)))
    images = [image((1, 16, 16, 3), seed) for seed in range(8)]
    expected = [litert_oracle(model, {"image": x})["probs"] for x in images]

    def job(thread: int, i: int) -> None:
        k = (thread * 7 + i) % len(images)
        variant = ("delegate", "cpu")[(thread + i) % 2]
        got = executable.run({"image": images[k]}, variant=variant)["probs"]
        np.testing.assert_allclose(got, expected[k], rtol=1e-6, err_msg=f"thread {thread} run {i} on {variant}")

    _hammer(job)


def test_signatures_and_primary_from_many_threads(tflite_models: dict[str, Path]) -> None:
    executable = TFLiteBackend().compile(tflite_models["two_signatures"], CompileOptions(intra_op_threads=1))
    rng = np.random.default_rng(5)
    arrays = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(6)]
    vectors = [rng.normal(size=4).astype(np.float32) for _ in range(6)]

    def job(thread: int, i: int) -> None:
        k = (thread + 3 * i) % 6
        a, b, x = arrays[k], arrays[(k + 1) % 6], vectors[k]
        entry = (thread + i) % 3  # primary, combine and affine share one interpreter and its lock
        if entry == 0:
            got = executable.run({"combine_a": a, "combine_b": b})["combine_sum"]
            np.testing.assert_allclose(got, a + b, rtol=1e-6)
        elif entry == 1:
            got = executable.run({"a": a, "b": b}, signature="combine")["product"]
            np.testing.assert_allclose(got, a * b, rtol=1e-6)
        else:
            np.testing.assert_allclose(executable.run({"x": x}, signature="affine")["y"], 3 * x + 1, rtol=1e-6)

    _hammer(job)
