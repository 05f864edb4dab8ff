"""onnxruntime-genai VLM folders (``genai_config.json`` with a ``vision`` section) through ``GenerativeModel``.

The folder is built locally (``genai_vlm_folder.write_genai_vlm_folder``) from a tiny random-weight
Qwen2.5-VL in the transformers.js layout (``vlm_zoo``): genai runs its vision graph, the embedding
graph that splices the image features in, the decoder, and its own M-RoPE positions and image
preprocessing (onnxruntime-extensions); we decode the images and tokenise the prompt.

Oracle: a no-cache greedy recompute over the *source* folder's graphs in plain ONNX Runtime
(``vlm_oracle.Oracle``: ``embed_tokens`` + a numpy splice, not genai's embedding graph; our own
preprocessing, which is tested equal to transformers'; positions from transformers'
``get_rope_index``), with prompt ids from our tokenizer. Images are sized in whole 28-px units,
where genai's smart resize and transformers' agree (see ``genai_vision``'s docstring for the tie).
Our own VLM engine on the source folder must give the same tokens too.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edge_runtime.errors import InvalidInputError

pytest.importorskip("onnxruntime_genai")  # the genai extra; the test extra installs it

from vlm_oracle import Oracle  # noqa: E402

STEPS = 8


def _image(seed: int, width: int, height: int):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _data_url(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _messages(*images, text: str = "What should I tap next?") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": _data_url(image)}} for image in images]
    return [{"role": "system", "content": "You are a phone agent."},
            {"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from edge_runtime.genai_vlm_folder import write_genai_vlm_folder
    from edge_runtime.vlm_zoo import write_vlm_folder

    root = tmp_path_factory.mktemp("genai_vlm")
    source = write_vlm_folder(root / "tjs", "qwen2_5_vl", seed=3)
    return source, write_genai_vlm_folder(source, root / "genai")


@pytest.fixture(scope="module")
def models(folders: tuple[Path, Path]):
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings

    source, genai = folders
    made = [GenerativeModel(p.name, p, GenerationSettings(max_seq_len=1024), threads=1) for p in (genai, source)]
    yield made
    for model in made:
        model.close()


def _oracle_tokens(source: Path, model, messages: list[dict], images: list) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy tokens) by the oracle: our template + preprocessing + tokenizer, no genai."""
    from edge_runtime.generation.vision.folder import read_vlm_folder
    from edge_runtime.generation.vision.messages import split_images
    from edge_runtime.generation.vision.preprocess import VisionBudget, image_processor

    vlm = read_vlm_folder(source)
    processor = image_processor(source, vlm.config, VisionBudget())
    processed = [processor.process(image) for image in images]
    shaped, _ = split_images(messages)
    text = processor.expand(model.tokenizer.render(shaped, multimodal=True), processed)
    ids = model.tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
    return ids, Oracle(SimpleNamespace(vlm=vlm)).greedy(ids, processed, STEPS)


def test_the_genai_vlm_folder_loads_as_a_multimodal_model(models) -> None:
    from edge_runtime.generation.folder import is_generative_folder

    genai, _ = models
    assert is_generative_folder(genai.path)
    assert genai.backend == "onnxruntime-genai" and genai.is_multimodal
    assert genai.batcher.vision["filename"] == "vision.onnx"


@pytest.mark.parametrize("case", ["image_a", "image_b", "two_images", "text_only"])
def test_greedy_tokens_equal_the_oracle_and_our_engine(case: str, folders, models) -> None:
    source, _ = folders
    genai, ours = models
    images = {"image_a": [_image(1, 112, 84)], "image_b": [_image(2, 84, 140)],
              "two_images": [_image(1, 112, 84), _image(2, 84, 140)], "text_only": []}[case]
    messages = _messages(*images)
    ids, expected = _oracle_tokens(source, genai, messages, images)
    result = genai.generate(messages=messages, max_tokens=STEPS, ignore_eos=True)
    assert list(result.token_ids) == expected
    assert result.usage.prompt_tokens == len(ids)
    mine = ours.generate(messages=messages, max_tokens=STEPS, ignore_eos=True)
    assert mine.token_ids == result.token_ids and mine.text == result.text


def test_prompt_tokens_count_each_images_tokens(models) -> None:
    genai, _ = models
    text_only = genai.prepare(messages=_messages())
    # 112x84 px: 8x6 patches of 14 px, merged 2x2: 12 tokens; 84x140: 6x10 -> 15
    with_images = genai.prepare(messages=_messages(_image(1, 112, 84), _image(2, 84, 140)))
    image_id = genai.tokenizer.tokenizer.token_to_id("<|image_pad|>")
    assert with_images.ids.count(image_id) == 12 + 15
    # each image adds <|vision_start|>, its tokens and <|vision_end|> to the same text
    assert len(with_images.ids) == len(text_only.ids) + 2 * 2 + 12 + 15
    assert with_images.image_timings.images == 2 and with_images.image_timings.image_tokens == 27


def test_images_argument_with_a_plain_prompt_equals_messages_form(models) -> None:
    genai, _ = models
    image = _image(4, 112, 112)
    plain = genai.generate("Describe the screen.", images=[image], max_tokens=STEPS, ignore_eos=True)
    marked = genai.generate("<|vision_start|><|image_pad|><|vision_end|>Describe the screen.",
                            images=[image], max_tokens=STEPS, ignore_eos=True)
    assert plain.token_ids == marked.token_ids
    assert plain.usage.prompt_tokens == marked.usage.prompt_tokens


def test_bad_images_get_our_named_errors(models) -> None:
    genai, _ = models
    bad = [{"role": "user", "content": [{"type": "text", "text": "look"},
                                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    with pytest.raises(InvalidInputError, match=r"^messages\[0\]\.content\[1\]\.image_url"):
        genai.generate(messages=bad, max_tokens=2)
    with pytest.raises(InvalidInputError, match=r"^messages\[0\]\.content\[0\]\.image_url: .*(refus|not allowed)"):
        genai.generate(messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}], max_tokens=2)
    with pytest.raises(InvalidInputError, match=r"^images\[0\]"):
        genai.generate("look", images=[b"not an image"], max_tokens=2)
    with pytest.raises(InvalidInputError, match="1 image placeholder"):
        genai.generate("<|vision_start|><|image_pad|><|vision_end|>look", images=[_image(1, 56, 56)] * 2,
                       max_tokens=2)
    # still serving after the refusals
    assert genai.generate(messages=_messages(_image(1, 112, 84)), max_tokens=2).usage.completion_tokens == 2


def test_embedding_graph_splices_in_order_and_takes_no_features(folders) -> None:
    import onnxruntime as ort

    source, genai = folders
    embed = ort.InferenceSession(str(source / "onnx" / "embed_tokens.onnx"), providers=["CPUExecutionProvider"])
    splice = ort.InferenceSession(str(genai / "embedding.onnx"), providers=["CPUExecutionProvider"])
    image_id = 12  # vlm_zoo's <|image_pad|>
    ids = np.array([[5, image_id, image_id, 7, image_id, 9]], np.int64)
    table = embed.run(None, {"input_ids": ids})[0]
    hidden = table.shape[-1]
    features = np.random.default_rng(0).standard_normal((3, hidden)).astype(np.float32)
    got = splice.run(None, {"input_ids": ids, "image_features": features})[0]
    expected = table.copy()
    expected[0, [1, 2, 4]] = features
    np.testing.assert_array_equal(got, expected)
    text = np.array([[5, 6, 7]], np.int64)
    np.testing.assert_array_equal(
        splice.run(None, {"input_ids": text, "image_features": np.zeros((0, hidden), np.float32)})[0],
        embed.run(None, {"input_ids": text})[0])


def test_the_footprint_counts_all_three_graphs(folders) -> None:
    from edge_runtime.generation.genai_engine import read_genai_folder

    _, genai = folders
    names = {p.name for p in read_genai_folder(genai).weight_files}
    assert {"vision.onnx", "embedding.onnx", "decoder_model_merged.onnx", "decoder_model_merged.onnx_data"} <= names


def test_a_genai_vlm_type_we_cannot_prompt_serves_text_only(folders, tmp_path: Path, caplog) -> None:
    import json
    import shutil

    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings

    _, genai = folders
    folder = Path(shutil.copytree(genai, tmp_path / "other"))
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["type"] = "gemma3"  # a genai VLM type whose image prompts genai_vision does not build
    (folder / "genai_config.json").write_text(json.dumps(config))
    with caplog.at_level("WARNING"):
        model = GenerativeModel("other", folder, GenerationSettings(max_seq_len=256), threads=1)
    try:
        assert not model.is_multimodal and "serving it as a text model" in caplog.text
        with pytest.raises(InvalidInputError, match="other is not a multimodal model"):
            model.generate("look", images=[_image(1, 56, 56)], max_tokens=2)
    finally:
        model.close()


def test_streamed_image_request_equals_non_streamed(models) -> None:
    import asyncio

    genai, _ = models
    messages = _messages(_image(5, 140, 84))

    async def streamed() -> tuple[str, list[int]]:
        text, ids = [], []
        async for chunk in genai.stream(messages=messages, max_tokens=STEPS, ignore_eos=True):
            text.append(chunk.text)
            ids.extend(chunk.token_ids)
        return "".join(text), ids

    text, ids = asyncio.run(streamed())
    whole = genai.generate(messages=messages, max_tokens=STEPS, ignore_eos=True)
    assert (text, ids) == (whole.text, list(whole.token_ids))
