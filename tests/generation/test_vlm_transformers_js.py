"""Converted VLM folders run unchanged in transformers.js, with the same greedy tokens as transformers.

transformers.js (``@huggingface/transformers`` on ``onnxruntime-node``) is the reference
consumer of the layout. Install it once (CI does; the pinned version is in
``tests/generation/js/package.json``):

    npm ci --ignore-scripts --prefix tests/generation/js

``--ignore-scripts`` skips onnxruntime-node's postinstall download; its bundled linux
x64/arm64 CPU binaries are enough. Without it the test skips (a failure under CI=true).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from vlm_checkpoints import VLMSpec, checkpoint, load_model, qwen_inputs, sample_image, vlm_root

torch = pytest.importorskip("torch")

JS = Path(__file__).resolve().parent / "js"
INSTALL = "npm ci --ignore-scripts --prefix tests/generation/js"


def node_greedy(folder: Path, image: Path, prompt: str, max_new: int) -> dict:
    node = shutil.which("node")
    if node is None or not (JS / "node_modules" / "@huggingface" / "transformers").is_dir():
        pytest.skip(f"transformers.js is not installed: run `{INSTALL}` (and install node >= 18)")
    done = subprocess.run([node, str(JS / "vlm_greedy.mjs"), str(folder), str(image), prompt, str(max_new)],
                          capture_output=True, text=True, timeout=300, cwd=JS)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("spec", [VLMSpec(family="qwen2_vl")], ids=lambda s: s.family)
def test_transformers_js_greedy_tokens_equal_transformers(spec: VLMSpec, tmp_path_factory, tmp_path: Path) -> None:
    from edge_runtime.vision_convert import convert_vlm_folder

    hf = checkpoint(spec, vlm_root(tmp_path_factory))
    folder = convert_vlm_folder(hf, tmp_path / spec.family)
    image, prompt = sample_image(seed=5), "tap the settings button"
    image.save(tmp_path / "screen.png")
    inputs = qwen_inputs(folder, image, prompt)
    with torch.no_grad():
        generated = load_model(hf).generate(**{k: torch.from_numpy(v) for k, v in inputs.items()},
                                            max_new_tokens=12, do_sample=False)
    expected = generated[0, inputs["input_ids"].shape[1]:].tolist()
    js = node_greedy(folder, tmp_path / "screen.png", prompt, 12)
    assert js["prompt_ids"] == inputs["input_ids"][0].tolist()  # same template rendering and image expansion
    assert js["tokens"] == expected
