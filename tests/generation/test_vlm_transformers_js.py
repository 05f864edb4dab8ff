"""Converted VLM folders run unchanged in transformers.js, with the same greedy tokens as transformers.

transformers.js (``@huggingface/transformers`` on ``onnxruntime-node``) is the reference
consumer of the layout. Install it once (CI does; the pinned version is in
``tests/generation/js/package.json``):

    npm ci --ignore-scripts --prefix tests/generation/js

``--ignore-scripts`` skips onnxruntime-node's postinstall download; its bundled linux
x64/arm64 CPU binaries are enough. Without it the test skips (a failure under CI=true).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from vlm_checkpoints import (QWEN3_4B_HEADS, VLMSpec, checkpoint, load_model, model_inputs, onnx_greedy, sample_image,
                             vlm_root, zoo_checkpoint)

torch = pytest.importorskip("torch")

JS = Path(__file__).resolve().parent / "js"
INSTALL = "npm ci --ignore-scripts --prefix tests/generation/js"


def node_greedy(folder: Path, image: Path, prompt: str, max_new: int, dtype: str = "fp32") -> dict:
    node = shutil.which("node")
    if node is None or not (JS / "node_modules" / "@huggingface" / "transformers").is_dir():
        pytest.skip(f"transformers.js is not installed: run `{INSTALL}` (and install node >= 18)")
    done = subprocess.run([node, str(JS / "vlm_greedy.mjs"), str(folder), str(image), prompt, str(max_new), dtype],
                          capture_output=True, text=True, timeout=300, cwd=JS)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# Image sizes chosen so that the processors need no resampling, except SmolVLM's global image (64 -> 32):
# transformers.js resizes with sharp, transformers with Pillow, and their filters differ slightly.
CASES = [(VLMSpec(family="qwen2_vl"), (84, 56)), (VLMSpec(family="qwen2_5_vl", seed=3, vision_depth=3), (140, 112)),
         (VLMSpec(family="idefics3", seed=1, split=False, longest_edge=32), (32, 32)),
         (VLMSpec(family="smolvlm", seed=2), (64, 64)),
         # Qwen3-VL: its DeepStack sets ride in the widened rows transformers.js splices like any others
         (VLMSpec(family="qwen3_vl", seed=8, image_size=64, vision_depth=3), (128, 64)),
         (QWEN3_4B_HEADS, (160, 320))]  # transformers.js sizes its KV by the config's head_dim
DTYPES = {"float32": np.float32, "int64": np.int64, "bool": np.bool_}


def decode(tensor: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(tensor["b64"]), DTYPES[tensor["dtype"]]).reshape(tensor["dims"])


@pytest.mark.parametrize("spec,size", CASES, ids=[spec.family + ("-4b-heads" if spec.head_dim else "")
                                                  for spec, _ in CASES])
def test_transformers_js_greedy_tokens_equal_transformers(spec: VLMSpec, size: tuple, tmp_path_factory,
                                                          tmp_path: Path) -> None:
    """A converted checkpoint."""
    from edge_runtime.vision_convert import convert_vlm_folder

    hf = checkpoint(spec, vlm_root(tmp_path_factory))
    check_against_transformers(spec.family, convert_vlm_folder(hf, tmp_path / spec.family), hf, size, tmp_path)


@pytest.mark.parametrize("family,size", [("qwen2_vl", (84, 56)), ("smolvlm", (64, 64)), ("qwen3_vl", (128, 64))])
def test_zoo_folders_run_in_transformers_js(family: str, size: tuple, tmp_path: Path) -> None:
    """A ``write_vlm_folder`` folder (our own config.json, tokenizer and processor files)."""
    from edge_runtime.vlm_zoo import write_vlm_folder

    folder = write_vlm_folder(tmp_path / family, family, seed=4)
    check_against_transformers(family, folder, zoo_checkpoint(folder, family, 4, tmp_path / "hf"), size, tmp_path)


def test_glm4v_parts_run_in_transformers_js_under_its_glm_ocr_class(tmp_path_factory, tmp_path: Path) -> None:
    """transformers.js has no ``glm4v`` model, but its ``glm_ocr`` one runs GLM's host loop (Qwen2.5-VL's
    flow, GLM's image-token position grouping, ``Glm46VImageProcessor``'s two-frame bounds). With only the
    family names in config.json and preprocessor_config.json changed, the converted GLM-4.1V parts give
    transformers.js the prompt ids and greedy tokens transformers' Glm4v gives."""
    from edge_runtime.vision_convert import convert_vlm_folder

    hf = checkpoint(VLMSpec(family="glm4v", seed=4, image_size=112), vlm_root(tmp_path_factory))
    folder = convert_vlm_folder(hf, tmp_path / "glm")
    config = json.loads((folder / "config.json").read_text())
    config["model_type"], config["text_config"]["model_type"] = "glm_ocr", "glm_ocr_text"
    (folder / "config.json").write_text(json.dumps(config))
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    pre.update(image_processor_type="Glm46VImageProcessor", processor_class="Glm46VProcessor")
    (folder / "preprocessor_config.json").write_text(json.dumps(pre))
    check_against_transformers("glm4v", folder, hf, (84, 56), tmp_path)


def check_against_transformers(family: str, folder: Path, hf: Path, size: tuple, tmp_path: Path) -> None:
    image, prompt = sample_image(*size, seed=5), "tap the settings button"
    image.save(tmp_path / "screen.png")
    inputs = model_inputs(family, folder, image, prompt)
    js = node_greedy(folder, tmp_path / "screen.png", prompt, 12)
    assert js["prompt_ids"] == inputs["input_ids"][0].tolist()  # same template rendering and image expansion
    js_inputs = {name: decode(tensor) for name, tensor in js["inputs"].items()}
    assert sorted(js_inputs) == sorted(set(inputs) - {"input_ids", "attention_mask"})
    exact = slice(None) if family != "smolvlm" else slice(0, -1)  # all but SmolVLM's resized global tile
    np.testing.assert_allclose(js_inputs["pixel_values"][:, exact], inputs["pixel_values"][:, exact], atol=1e-5)
    np.testing.assert_allclose(js_inputs["pixel_values"], inputs["pixel_values"], atol=0.5)
    for name in set(js_inputs) - {"pixel_values"}:
        np.testing.assert_array_equal(js_inputs[name], inputs[name])
    # transformers on the pixels transformers.js made: any difference left is in the models
    inputs.update(js_inputs)
    with torch.no_grad():
        generated = load_model(hf).generate(**{k: torch.from_numpy(np.array(v)) for k, v in inputs.items()},
                                            max_new_tokens=12, do_sample=False)
    expected = generated[0, inputs["input_ids"].shape[1]:].tolist()
    assert js["tokens"] == expected
    assert len(set(expected)) > 3


def test_fp16_parts_run_in_transformers_js_like_in_onnxruntime(tmp_path_factory, tmp_path: Path) -> None:
    """``--fp16`` variants: transformers.js with dtype fp16 loads the ``_fp16`` files and decodes the same
    tokens as our host loop over those files (fp16 may differ from fp32, so the oracle runs the same files)."""
    from edge_runtime.vision_convert import convert_vlm_folder

    hf = checkpoint(VLMSpec(family="qwen2_vl"), vlm_root(tmp_path_factory))
    folder = convert_vlm_folder(hf, tmp_path / "qwen2_vl", fp16=True)
    image, prompt = sample_image(84, 56, seed=5), "tap the settings button"
    image.save(tmp_path / "screen.png")
    inputs = model_inputs("qwen2_vl", folder, image, prompt)
    js = node_greedy(folder, tmp_path / "screen.png", prompt, 12, dtype="fp16")
    assert js["prompt_ids"] == inputs["input_ids"][0].tolist()
    assert js["tokens"] == onnx_greedy("qwen2_vl", folder, load_model(hf), inputs, 12, suffix="_fp16")


@pytest.mark.parametrize("dtype", ["q8", "q4"])
def test_one_dtype_name_loads_every_quantized_part_in_transformers_js_and_ours(tmp_path_factory, tmp_path: Path,
                                                                              dtype: str) -> None:
    """transformers.js' one-name ``dtype: "q8"`` / ``"q4"`` asks every part at that precision (the
    ``_quantized`` / ``_q4`` files, the embedding table and vision encoder included); on a ``--quantize``
    folder it loads them all and decodes the tokens our engine decodes with ``[vision] precision`` the
    same name."""
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.generation.vision.settings import VisionSettings
    from edge_runtime.vision_convert import convert_vlm_folder

    hf = checkpoint(VLMSpec(family="qwen2_vl"), vlm_root(tmp_path_factory))
    folder = convert_vlm_folder(hf, tmp_path / "qwen2_vl", quantize=True)
    image, prompt = sample_image(84, 56, seed=5), "tap the settings button"
    image.save(tmp_path / "screen.png")
    js = node_greedy(folder, tmp_path / "screen.png", prompt, 12, dtype=dtype)
    messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": prompt}]}]
    model = GenerativeModel("q", folder, GenerationSettings(max_seq_len=512), threads=1,
                            vision=VisionSettings(precision=dtype))
    try:
        ours = model.generate(messages=messages, max_tokens=12)
        assert js["prompt_ids"] == list(model.prepare(messages=messages).ids)
    finally:
        model.close()
    assert js["tokens"] == list(ours.token_ids)


@pytest.mark.parametrize("decoder", ["q4", "q8"])
def test_quantized_parts_run_in_transformers_js_like_in_our_engine(tmp_path_factory, tmp_path: Path,
                                                                    decoder: str) -> None:
    """``--quantize`` parts under transformers.js' names: transformers.js with a per-part dtype (q8 vision
    encoder; q4 decoder, or the per-token int8 one) loads them and decodes the tokens our engine decodes
    from the same files."""
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.generation.vision.settings import VisionSettings
    from edge_runtime.vision_convert import convert_vlm_folder

    hf = checkpoint(VLMSpec(family="qwen2_vl"), vlm_root(tmp_path_factory))
    folder = convert_vlm_folder(hf, tmp_path / "qwen2_vl", quantize=True)
    image, prompt = sample_image(84, 56, seed=5), "tap the settings button"
    image.save(tmp_path / "screen.png")
    js = node_greedy(folder, tmp_path / "screen.png", prompt, 12, dtype=json.dumps(
        {"embed_tokens": "fp32", "vision_encoder": "q8", "decoder_model_merged": decoder}))
    model = GenerativeModel("q", folder, GenerationSettings(max_seq_len=512), threads=1,
                            vision=VisionSettings(precision={"decoder": decoder, "vision_encoder": "q8"}))
    try:
        ours = model.generate(messages=[{"role": "user", "content": [{"type": "image", "image": image},
                                                                     {"type": "text", "text": prompt}]}],
                              max_tokens=12)
        assert js["prompt_ids"] == list(model.prepare(messages=[{"role": "user", "content": [
            {"type": "image", "image": image}, {"type": "text", "text": prompt}]}]).ids)
    finally:
        model.close()
    assert js["tokens"] == list(ours.token_ids)
