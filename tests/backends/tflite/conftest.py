"""Fixtures for the tflite backend tests: generated models, the test delegate, the plain-LiteRT oracle.

Models are written by ``tools/make_tflite_models.py`` at session start (no
download, no TensorFlow). The external delegate is compiled from
``edge_test_delegate.c`` with the system C compiler. The oracle is a plain
LiteRT ``Interpreter``, configured the way a user would, fed the same arrays.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
IN_CI = os.environ.get("CI", "").lower() == "true"

@pytest.fixture(scope="session")
def tflite_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{stem: path}`` of every model ``make_tflite_models`` builds."""
    import make_tflite_models

    out = tmp_path_factory.mktemp("tflite_models")
    make_tflite_models.main([str(out)])
    return {path.stem: path for path in out.glob("*.tflite")}


def _compile(out: Path, *flags: str) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        message = "no C compiler (cc/gcc) to build the test delegate"
        if IN_CI:
            pytest.fail(f"{message} (CI=true: this must run, not skip)")
        pytest.skip(message)
    command = [compiler, "-shared", "-fPIC", "-O1", "-Wall", *flags, "-o", str(out), str(HERE / "edge_test_delegate.c")]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"building the test delegate failed:\n{result.stderr}"
    return out


@pytest.fixture(scope="session")
def delegate_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test external delegate (see ``edge_test_delegate.c`` for its options)."""
    return _compile(tmp_path_factory.mktemp("delegate") / "libedge_test_delegate.so")


@pytest.fixture(scope="session")
def gpu_named_delegate(delegate_library: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same delegate under a GPU delegate's file name."""
    path = tmp_path_factory.mktemp("gpu") / "libedge_test_gpu_delegate.so"
    shutil.copyfile(delegate_library, path)
    return path


@pytest.fixture(scope="session")
def no_symbol_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shared library without the TFLite plugin entry points."""
    return _compile(tmp_path_factory.mktemp("nosym") / "libnot_a_delegate.so", "-DEDGE_NO_PLUGIN_SYMBOLS")


@pytest.fixture(scope="session")
def litert_oracle() -> Callable[..., dict[str, np.ndarray]]:
    """``oracle(model_path, feeds, signature=None, threads=1)``: outputs of a plain LiteRT interpreter."""
    from ai_edge_litert.interpreter import Interpreter

    def run(model: Path, feeds: dict[str, np.ndarray], signature: str | None = None,
            threads: int = 1) -> dict[str, np.ndarray]:
        interpreter = Interpreter(model_path=str(model), num_threads=threads)
        if signature is not None:
            return interpreter.get_signature_runner(signature)(**feeds)
        interpreter.allocate_tensors()
        for detail in interpreter.get_input_details():
            interpreter.set_tensor(detail["index"], feeds[detail["name"]])
        interpreter.invoke()
        return {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}

    return run


def random_image(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """A float32 image in [-1, 1)."""
    return np.random.default_rng(seed).uniform(-1, 1, size=shape).astype(np.float32)


@pytest.fixture(scope="session")
def image() -> Callable[[tuple[int, ...], int], np.ndarray]:
    """``image(shape, seed)``: a float32 array in [-1, 1), the same for the same seed."""
    return random_image


def log_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def read_log() -> Callable[[Path], list[str]]:
    """``read_log(path)``: the test delegate's log lines (empty when it wrote none)."""
    return log_lines
