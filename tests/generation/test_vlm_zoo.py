"""``write_vlm_folder``: tiny VLM folders built without torch, checked against transformers on the same weights.

The folder's own ``config.json``, tokenizer, chat template and processor files are loaded
by transformers (with ``random_vlm_weights`` saved beside them), so the files the engine
and the demo read are the ones checked; greedy tokens from the folder's ONNX parts equal
``generate(do_sample=False)``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vlm_checkpoints import load_model, model_inputs, onnx_greedy, sample_image, zoo_checkpoint

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "idefics3", "smolvlm", "glm4v", "qwen3_vl")


@pytest.mark.parametrize("family", FAMILIES)
def test_zoo_folder_generates_like_transformers_on_the_same_weights(family: str, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from edge_runtime.vlm_zoo import write_vlm_folder

    folder = write_vlm_folder(tmp_path / family, family, seed=4)
    model = load_model(zoo_checkpoint(folder, family, 4, tmp_path / "hf"))
    inputs = model_inputs(family, folder, sample_image(112, 84, seed=6), "open the settings menu")
    with torch.no_grad():
        generated = model.generate(**{k: torch.from_numpy(v) for k, v in inputs.items()}, max_new_tokens=12,
                                   do_sample=False)
    expected = generated[0, inputs["input_ids"].shape[1]:].tolist()
    assert onnx_greedy(family, folder, model, inputs, 12) == expected
    assert len(set(expected)) > 3


@pytest.mark.aarch64
def test_zoo_folders_are_built_without_torch_or_transformers(tmp_path: Path) -> None:
    code = ("import sys\nfrom edge_runtime.vlm_zoo import FAMILIES, write_vlm_folder\n"
            f"for family in FAMILIES:\n    write_vlm_folder({str(tmp_path)!r} + '/' + family, family)\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for family in FAMILIES:
        names = sorted(p.name for p in (tmp_path / family / "onnx").iterdir())
        assert names == ["decoder_model_merged.onnx", "decoder_model_merged.onnx_data", "embed_tokens.onnx",
                         "embed_tokens.onnx_data", "vision_encoder.onnx", "vision_encoder.onnx_data"], family


def test_a_qwen3_vl_folder_without_deepstack_rows_runs_like_transformers(tmp_path: Path) -> None:
    """Qwen3-VL folders exported by others keep hidden-wide rows (no DeepStack sets): that form, here a tower
    without ``deepstack_visual_indexes``, runs in the engine to transformers' greedy tokens."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.vision_graphs_qwen3vl import Qwen3VisionSpec
    from edge_runtime.vlm_zoo import VLMShape, write_vlm_folder

    shape = VLMShape(vision=Qwen3VisionSpec(out_hidden=64, mlp_hidden=64, positions=16, deepstack=()))
    folder = write_vlm_folder(tmp_path / "qwen3", "qwen3_vl", shape, seed=5)
    model = load_model(zoo_checkpoint(folder, "qwen3_vl", 5, tmp_path / "hf", shape))
    image = sample_image(112, 84, seed=6)
    inputs = model_inputs("qwen3_vl", folder, image, "open the settings menu")
    with torch.no_grad():
        generated = model.generate(**{k: torch.from_numpy(v) for k, v in inputs.items()}, max_new_tokens=12,
                                   do_sample=False)
    expected = generated[0, inputs["input_ids"].shape[1]:].tolist()
    engine = GenerativeModel("qwen3", folder, GenerationSettings(max_seq_len=1024), threads=1)
    try:
        assert engine.vlm.hidden_size == 64  # the rows are the text model's width
        messages = [{"role": "user", "content": [{"type": "image", "image": image},
                                                 {"type": "text", "text": "open the settings menu"}]}]
        assert list(engine.generate(messages=messages, max_tokens=12).token_ids) == expected
    finally:
        engine.close()
    assert len(set(expected)) > 3
