"""Decoder models for the generation tests, built locally and cached by their spec.

The models are ``transformers`` Qwen2-style (GQA, tied embeddings) and
Llama-style models with random weights, exported by ``optimum`` (see
``tools/hf_decoders.py``). They are cached under ``$EDGE_RUNTIME_TEST_MODELS``
(default ``~/.cache/edge-runtime/test-models``): the first run exports them
(~20 s each), later runs reuse them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from generation_fixtures import SPECS, make_model, models_root, unfused_variant
from hf_decoders import hf_folder, optimum_folder

@pytest.fixture(scope="session", params=sorted(SPECS))
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def onnx_folder(arch: str) -> Path:
    return optimum_folder(SPECS[arch], models_root())


@pytest.fixture(scope="session")
def qwen_folder() -> Path:
    return optimum_folder(SPECS["qwen2"], models_root())


@pytest.fixture(scope="session")
def hf_model_folder(arch: str) -> Path:
    return hf_folder(SPECS[arch], models_root())


@pytest.fixture(scope="session")
def fused_folder(arch: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Our GroupQueryAttention graph (``decoder_fused``) of the same weights as ``onnx_folder``."""
    from edge_runtime.decoder_zoo import decoder_folder_from_hf

    return decoder_folder_from_hf(hf_folder(SPECS[arch], models_root()), tmp_path_factory.mktemp(f"fused-{arch}"),
                                  fused=True)


@pytest.fixture(scope="session", params=["unfused", "optimum"])
def batching_folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Qwen2-style optimum export served as exported (ping-pong KV) and as it loads by default:
    rebuilt as our fused graph (``fused_exports``: GroupQueryAttention, KV in place)."""
    export = optimum_folder(SPECS["qwen2"], models_root())
    if request.param == "optimum":
        return export
    return unfused_variant(export, tmp_path_factory.mktemp("unfused") / "qwen2")


@pytest.fixture
def model_factory():
    """Build GenerativeModels with given settings; all are closed at teardown."""
    made = []

    def build(folder: Path, **settings):
        model = make_model(folder, **settings)
        made.append(model)
        return model

    yield build
    for model in made:
        model.close()
