"""Decoder models for the generation tests, built locally and cached by their spec.

The models are ``transformers`` Qwen2-style (GQA, tied embeddings) and
Llama-style models with random weights, exported by ``optimum`` (see
``tools/hf_decoders.py``). They are cached under ``$EDGE_RUNTIME_TEST_MODELS``
(default ``~/.cache/edge-runtime/test-models``): the first run exports them
(~20 s each), later runs reuse them.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from hf_decoders import DecoderSpec, hf_folder, optimum_folder

SPECS = {
    "qwen2": DecoderSpec(arch="qwen2", hidden=64, layers=2, heads=4, kv_heads=2, vocab=512, max_positions=256),
    "llama": DecoderSpec(arch="llama", hidden=64, layers=2, heads=4, kv_heads=4, vocab=512, max_positions=256,
                         seed=3),
}


def models_root() -> Path:
    root = Path(os.environ.get("EDGE_RUNTIME_TEST_MODELS", Path.home() / ".cache" / "edge-runtime" / "test-models"))
    root.mkdir(parents=True, exist_ok=True)
    return root


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


def make_model(folder: Path, **settings):
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings

    return GenerativeModel(folder.name, folder, GenerationSettings(**settings), threads=1)


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


def oracle_greedy(folder: Path, prompt: list[int], max_new: int, eos: set[int]) -> list[int]:
    """No-cache oracle: recompute the whole sequence each step (empty past), take the argmax."""
    import onnxruntime as ort

    from edge_runtime.generation.engine import kv_names
    from edge_runtime.generation.folder import read_folder

    description = read_folder(folder)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(description.model_path), options, providers=["CPUExecutionProvider"])
    layout = description.kv
    past_names, _ = kv_names(layout.layers)
    tokens = list(prompt)
    out: list[int] = []
    for _ in range(max_new):
        n = len(tokens)
        feeds = {"input_ids": np.array([tokens], np.int64), "attention_mask": np.ones((1, n), np.int64)}
        if description.has_position_ids:
            feeds["position_ids"] = np.arange(n, dtype=np.int64)[None]
        for name in past_names:
            feeds[name] = np.zeros((1, layout.kv_heads, 0, layout.head_dim), layout.dtype)
        token = int(np.argmax(session.run(["logits"], feeds)[0][0, -1]))
        out.append(token)
        tokens.append(token)
        if token in eos:
            break
    return out
