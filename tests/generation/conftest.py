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

from generation_fixtures import SPECS, make_model, models_root
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
