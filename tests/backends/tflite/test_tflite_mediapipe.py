"""Real vision models: the ``.tflite`` files inside a mediapipe 0.10.x wheel.

They come from an installed ``mediapipe`` package, or from a wheel (or a
folder of wheels or ``.tflite`` files) named by ``EDGE_RUNTIME_TEST_MEDIAPIPE``;
mediapipe is never imported. mediapipe >= 0.10.30 wheels no longer carry the
models: use 0.10.14 (``pip download --no-deps mediapipe==0.10.14``). Without
either source these tests skip; a source that holds no model fails them.

``iris_landmark`` and ``hand_recrop`` are float32 models; the others keep
their weights float16-quantized (DEQUANTIZE nodes feed the convolutions).
Oracle: a plain LiteRT interpreter on the same file, threads and input.
"""

from __future__ import annotations

import importlib.util
import os
import re
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from backends.base import CompileOptions, DelegateSpec
from backends.errors import ModelLoadError
from backends.tflite import TFLiteBackend

pytestmark = [pytest.mark.requires_litert, pytest.mark.aarch64]

MODELS = {  # file name -> what it is, for the report
    "iris_landmark.tflite": "float32",
    "hand_recrop.tflite": "float32",
    "face_detection_short_range.tflite": "float16-quantized weights",
    "face_landmark.tflite": "float16-quantized weights",
    "selfie_segmentation.tflite": "float16-quantized weights, custom op Convolution2DTransposeBias",
}


def _from_package() -> dict[str, Path]:
    spec = importlib.util.find_spec("mediapipe")
    if spec is None or not spec.submodule_search_locations:
        return {}
    root = Path(next(iter(spec.submodule_search_locations)))
    return {path.name: path for path in (root / "modules").glob("*/*.tflite") if path.name in MODELS}


def _from_wheels(source: Path, out: Path) -> dict[str, Path]:
    if not source.exists():
        return {}
    found = {path.name: path for path in source.glob("*.tflite") if path.name in MODELS} if source.is_dir() else {}
    wheels = sorted(source.glob("mediapipe-*.whl")) if source.is_dir() else [source]
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                name = member.rsplit("/", 1)[-1]
                if name in MODELS and name not in found:
                    found[name] = out / name
                    found[name].write_bytes(archive.read(member))
    return found


@pytest.fixture(scope="module")
def mediapipe_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    found = _from_package()
    source = os.environ.get("EDGE_RUNTIME_TEST_MEDIAPIPE")
    if len(found) < len(MODELS) and source:
        found = {**_from_wheels(Path(source), tmp_path_factory.mktemp("mediapipe")), **found}
    if not found and source:
        pytest.fail(f"EDGE_RUNTIME_TEST_MEDIAPIPE={source} holds none of {sorted(MODELS)} (mediapipe >= 0.10.30?)")
    if not found:
        message = "no mediapipe 0.10.x models: install mediapipe==0.10.14 or set EDGE_RUNTIME_TEST_MEDIAPIPE"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message} (CI=true: .ci/run provides them; this must run, not skip)")
        pytest.skip(message)
    return found


def _model(models: dict[str, Path], name: str) -> Path:
    if name not in models:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{name} not in the mediapipe models found (CI=true)")
        pytest.skip(f"{name} not in the mediapipe models found")
    return models[name]


def _feeds(model: Path, seed: int) -> dict[str, np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    rng = np.random.default_rng(seed)
    return {d["name"]: rng.uniform(-1, 1, size=d["shape"]).astype(np.float32)
            for d in Interpreter(model_path=str(model)).get_input_details()}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_outputs_equal_plain_litert(name: str, mediapipe_models: dict[str, Path],
                                    litert_oracle: Callable) -> None:
    model = _model(mediapipe_models, name)
    try:
        litert_oracle(model, _feeds(model, 0), threads=2)
    except RuntimeError as exc:
        # NOTE: seen on arm64 (ai-edge-litert 2.3.0): selfie segmentation's custom op
        # Convolution2DTransposeBias is unresolved where x86_64 resolves it. Where plain LiteRT
        # refuses a model, ours must refuse it too, naming the same cause.
        op = str(exc).split("unresolved custom op: ", 1)[-1].split(".", 1)[0]
        with pytest.raises(ModelLoadError, match=f"LiteRT cannot load the model: .*{re.escape(op)}"):
            TFLiteBackend().compile(model, CompileOptions(intra_op_threads=2))
        return
    executable = TFLiteBackend().compile(model, CompileOptions(intra_op_threads=2))
    for seed in range(2):
        feeds = _feeds(model, seed)
        got, expected = executable.run(feeds), litert_oracle(model, feeds, threads=2)
        assert got.keys() == expected.keys() and got
        for output in got:
            np.testing.assert_array_equal(got[output], expected[output], err_msg=f"{name}: {output}")


@pytest.mark.parametrize("name", ["face_detection_short_range.tflite", "iris_landmark.tflite"])
def test_delegate_coverage_on_a_real_graph(name: str, mediapipe_models: dict[str, Path], delegate_library: Path,
                                           tmp_path: Path, litert_oracle: Callable) -> None:
    model = _model(mediapipe_models, name)
    log = tmp_path / "delegate.log"
    spec = DelegateSpec(str(delegate_library), (("log_path", str(log)), ("claim", "ADD")))
    executable = TFLiteBackend().compile(model, CompileOptions(intra_op_threads=2, delegates=(spec,)))
    lines = log.read_text().splitlines()
    # The delegate's own report is the oracle for what the backend read back from the interpreter.
    prepare = next(line for line in lines if line.startswith("prepare "))
    status = executable.delegate_status
    assert prepare == (f"prepare plan_nodes={status.coverage.total_nodes} "
                       f"claimed={status.coverage.nodes_delegated}")
    assert status.coverage.partitions == sum(line.startswith("kernel nodes=") for line in lines)
    assert status.coverage.nodes_delegated > 0
    feeds = _feeds(model, 3)
    expected = litert_oracle(model, feeds, threads=2)
    for variant in executable.variants:
        got = executable.run(feeds, variant=variant)
        for output in expected:
            np.testing.assert_allclose(got[output], expected[output], rtol=1e-4, atol=1e-4,
                                       err_msg=f"{name}: {output} on {variant}")
