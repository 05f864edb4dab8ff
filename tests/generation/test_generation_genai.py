"""onnxruntime-genai folders run through onnxruntime_genai (the ``genai`` extra) with our sampler on top.

The folder is the optimum export described in genai's format (``genai_config_for``);
the ORT engine on the same ONNX file is the oracle.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime_genai")  # the genai extra; the test extra installs it


@pytest.fixture(scope="module")
def genai_folder(qwen_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge_runtime.generation.folder import read_folder
    from edge_runtime.generation.genai_engine import genai_config_for

    folder = Path(shutil.copytree(qwen_folder, tmp_path_factory.mktemp("genai") / "qwen"))
    (folder / "genai_config.json").write_text(json.dumps(genai_config_for(read_folder(qwen_folder), threads=1)))
    return folder


def test_genai_folder_generates_the_same_tokens_as_the_ort_engine(genai_folder: Path, qwen_folder: Path,
                                                                   model_factory) -> None:
    from edge_runtime.generation.folder import is_generative_folder

    assert is_generative_folder(genai_folder)
    genai = model_factory(genai_folder)
    ours = model_factory(qwen_folder)
    assert genai.backend == "onnxruntime-genai"
    messages = [{"role": "user", "content": "open the settings menu"}]
    for kwargs in ({"messages": messages, "max_tokens": 16}, {"prompt": "the agent taps", "max_tokens": 12},
                   {"prompt": "the agent taps", "max_tokens": 12, "temperature": 0.8, "seed": 3}):
        a, b = genai.generate(**kwargs), ours.generate(**kwargs)
        assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason


def test_genai_folder_reports_context_and_queue_errors(genai_folder: Path, model_factory) -> None:
    from edge_runtime.errors import InvalidInputError

    model = model_factory(genai_folder, max_seq_len=32)
    with pytest.raises(InvalidInputError, match="context is 32 tokens"):
        model.generate(list(range(3, 43)), max_tokens=2)
