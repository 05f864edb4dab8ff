"""Image preprocessing per family against transformers' slow (PIL) image processors and processors.

Oracles: ``Qwen2VLImageProcessor`` (Qwen2.5-VL and Qwen3-VL use the same class), ``Glm4vImageProcessor``,
``Idefics3ImageProcessor`` and ``SmolVLMImageProcessor`` for pixel values, grids and tile counts;
``Qwen2VLProcessor``, ``Glm4vProcessor`` and ``Idefics3Processor`` for the prompt text (compared as token ids of a byte-level
tokenizer, which round-trips any text). ``SmolVLMProcessor`` cannot be imported without
torchvision (its video processor), so SmolVLM's prompt rule is taken from the functions of
the installed ``processing_smolvlm.py``, compiled from its source on their own.
The preprocessor_config.json files hold the values of the real checkpoints.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    Glm4vImageProcessor,
    Glm4vProcessor,
    Idefics3ImageProcessor,
    Idefics3Processor,
    PreTrainedTokenizerFast,
    Qwen2TokenizerFast,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
    SmolVLMImageProcessor,
)

from edge_runtime.errors import ConfigError, InvalidInputError, ModelLoadError
from edge_runtime.generation.vision.images import ImageAccess, image_digest
from edge_runtime.generation.vision.preprocess import (
    ImageProcessor,
    VisionBudget,
    image_processor,
    prepare_image,
)

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
# Qwen2-VL-2B-Instruct / Qwen2.5-VL-3B-Instruct.
QWEN_PRE = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,
            "merge_size": 2, "image_mean": CLIP_MEAN, "image_std": CLIP_STD, "do_resize": True,
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
            "resample": 3, "image_processor_type": "Qwen2VLImageProcessor"}
QWEN_VISION = {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}
# GLM-4.1V-9B-Thinking (AutoGLM-Phone-9B's base): bounds in size only, counted over 2 frames.
GLM_PRE = {"size": {"shortest_edge": 12544, "longest_edge": 9633792}, "patch_size": 14, "temporal_patch_size": 2,
           "merge_size": 2, "image_mean": CLIP_MEAN, "image_std": CLIP_STD, "do_resize": True, "do_rescale": True,
           "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True, "resample": 3,
           "image_processor_type": "Glm4vImageProcessor"}
# Qwen3-VL-2B-Instruct: 16-px patches, mean/std 0.5, bounds in size (its checkpoint names the fast processor
# class, which needs torchvision; the slow class with the same settings is the oracle, as the engine uses PIL)
QWEN3_PRE = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
             "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_resize": True,
             "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
             "resample": 3, "image_processor_type": "Qwen2VLImageProcessorFast"}
# SmolVLM-256M-Instruct: 512-px tiles, 64 tokens each (32x32 patches / 4²).
SMOLVLM_PRE = {"do_convert_rgb": True, "do_image_splitting": True, "do_normalize": True, "do_pad": True,
               "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
               "image_std": [0.5, 0.5, 0.5], "max_image_size": {"longest_edge": 512}, "resample": 1,
               "rescale_factor": 1 / 255, "size": {"longest_edge": 2048},
               "image_processor_type": "SmolVLMImageProcessor"}
SMOLVLM_CONFIG = {"model_type": "smolvlm", "scale_factor": 4,
                  "vision_config": {"image_size": 512, "patch_size": 16}}
# Idefics3-8B-Llama3: 364-px tiles, 169 tokens each (26x26 patches / 2²).
IDEFICS3_PRE = {**SMOLVLM_PRE, "max_image_size": {"longest_edge": 364}, "size": {"longest_edge": 1456},
                "image_processor_type": "Idefics3ImageProcessor"}
IDEFICS3_CONFIG = {"model_type": "idefics3", "scale_factor": 2,
                   "vision_config": {"image_size": 364, "patch_size": 14}}
ROW_COL_TOKENS = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]


def _folder(tmp_path: Path, pre: dict, processor_config: dict | None = None) -> Path:
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(pre))
    if processor_config is not None:
        (tmp_path / "processor_config.json").write_text(json.dumps(processor_config))
    return tmp_path


def _image(kind: str, width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    if kind == "random":
        return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    # "screen": a UI-like picture: white background, gradient header, dark text-like bars, sharp edges.
    array = np.full((height, width, 3), 255, dtype=np.uint8)
    array[: max(1, height // 12)] = np.linspace(30, 220, width, dtype=np.uint8)[None, :, None]
    for top in range(height // 10, height - 8, max(12, height // 40)):
        left = int(rng.integers(0, max(1, width // 4)))
        right = min(width, left + int(rng.integers(width // 4 + 1, width + 2)))
        array[top:top + 6, left:right] = rng.integers(0, 90, 3, dtype=np.uint8)
    return Image.fromarray(array)


def _byte_tokenizer(cls: type, specials: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer with no merges: any text round-trips; specials are single tokens."""
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = cls(tokenizer_object=tokenizer)
    fast.add_special_tokens({"additional_special_tokens": specials})
    return fast


def _image_only(processor_class: type) -> type:
    """``processor_class`` (Qwen2VLProcessor, Glm4vProcessor) without its video processor (that one needs
    torchvision); images and text go through transformers' own code."""

    class ImageOnly(processor_class):
        def check_argument_for_proper_class(self, argument_name, argument):  # noqa: ANN001, ANN201
            if argument_name == "video_processor":
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return ImageOnly


# --- Qwen2-VL / Qwen2.5-VL -------------------------------------------------------------------------

QWEN_CASES = [  # family, image kind, (width, height), budget
    ("qwen2_vl", "random", (224, 224), VisionBudget()),
    ("qwen2_vl", "screen", (1080, 2400), VisionBudget(max_pixels=1024 * 28 * 28)),
    ("qwen2_5_vl", "screen", (1080, 2400), VisionBudget(max_pixels=256 * 28 * 28)),
    ("qwen2_vl", "screen", (1080, 2400), VisionBudget()),  # the default: 3,354 tokens
    ("qwen2_5_vl", "random", (37, 500), VisionBudget()),
    ("qwen2_5_vl", "random", (640, 480), VisionBudget(min_pixels=401_408, max_pixels=802_816)),
    ("qwen2_vl", "random", (20, 20), VisionBudget()),  # below min_pixels: upscaled
    ("qwen2_vl", "screen", (1500, 10), VisionBudget(max_pixels=200_704)),  # aspect 150
    ("qwen2_5_vl", "screen", (333, 777), VisionBudget(min_pixels=100_000)),
]


@pytest.mark.parametrize("family, kind, size, budget", QWEN_CASES)
def test_qwen_equals_transformers(tmp_path: Path, family: str, kind: str, size: tuple[int, int],
                                  budget: VisionBudget) -> None:
    processor = image_processor(_folder(tmp_path, QWEN_PRE), {"model_type": family, "vision_config": QWEN_VISION},
                                budget)
    image = _image(kind, *size)
    ours = processor.process(image)
    overrides = {k: v for k, v in (("min_pixels", budget.min_pixels), ("max_pixels", budget.max_pixels))
                 if v is not None}
    reference = Qwen2VLImageProcessor(**QWEN_PRE)(images=[image], return_tensors="np", **overrides)
    grid_name = "grid_thw" if family == "qwen2_vl" else "image_grid_thw"
    assert set(ours.feeds) == {"pixel_values", grid_name}
    pixel_values = ours.feeds["pixel_values"]
    assert pixel_values.dtype == np.float32 and ours.feeds[grid_name].dtype == np.int64
    assert pixel_values.shape == reference["pixel_values"].shape
    np.testing.assert_allclose(pixel_values, reference["pixel_values"], rtol=0, atol=1e-5)
    assert np.array_equal(ours.feeds[grid_name], reference["image_grid_thw"])
    assert ours.grid_thw == tuple(int(v) for v in reference["image_grid_thw"][0])
    assert ours.num_tokens == int(reference["image_grid_thw"][0].prod()) // 4
    assert ours.num_tokens == processor.num_tokens(*size)
    assert ours.prompt_text == "<|image_pad|>" * ours.num_tokens
    if size == (1080, 2400) and budget == VisionBudget():
        assert ours.num_tokens == 3354  # the figure for a screenshot at Qwen2-VL's default


QWEN3_CASES = [  # image kind, (width, height), budget
    ("screen", (1080, 2400), VisionBudget()),  # the default (256² to 4096² pixels): 2,550 tokens
    ("screen", (1080, 2400), VisionBudget(max_pixels=1024 * 32 * 32)),
    ("random", (37, 500), VisionBudget()),  # below the minimum: upscaled
    ("random", (640, 480), VisionBudget(min_pixels=100_000, max_pixels=300_000)),
]


@pytest.mark.parametrize("kind, size, budget", QWEN3_CASES)
def test_qwen3_equals_transformers(tmp_path: Path, kind: str, size: tuple[int, int], budget: VisionBudget) -> None:
    vision = {"patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}
    processor = image_processor(_folder(tmp_path, QWEN3_PRE), {"model_type": "qwen3_vl", "vision_config": vision},
                                budget)
    image = _image(kind, *size)
    ours = processor.process(image)
    overrides = {k: v for k, v in (("min_pixels", budget.min_pixels), ("max_pixels", budget.max_pixels))
                 if v is not None}
    # The slow class drops a given ``size`` for its defaults unless min/max_pixels are passed too (transformers
    # 4.57's __init__); the fast class Qwen3-VL names, like the engine, takes ``size``'s bounds: passed here.
    bounds = {"min_pixels": QWEN3_PRE["size"]["shortest_edge"], "max_pixels": QWEN3_PRE["size"]["longest_edge"]}
    reference = Qwen2VLImageProcessor(**QWEN3_PRE, **bounds)(images=[image], return_tensors="np", **overrides)
    assert set(ours.feeds) == {"pixel_values", "image_grid_thw"}
    assert ours.feeds["pixel_values"].shape == reference["pixel_values"].shape
    assert ours.feeds["pixel_values"].shape[1] == 3 * 2 * 16 * 16
    np.testing.assert_allclose(ours.feeds["pixel_values"], reference["pixel_values"], rtol=0, atol=1e-5)
    assert np.array_equal(ours.feeds["image_grid_thw"], reference["image_grid_thw"])
    assert ours.num_tokens == int(reference["image_grid_thw"][0].prod()) // 4 == processor.num_tokens(*size)
    assert ours.prompt_text == "<|image_pad|>" * ours.num_tokens
    if size == (1080, 2400) and budget == VisionBudget():
        assert ours.num_tokens == 2550


def test_qwen_rejects_extreme_aspect_ratio(tmp_path: Path) -> None:
    processor = image_processor(_folder(tmp_path, QWEN_PRE), {"model_type": "qwen2_vl"}, VisionBudget())
    with pytest.raises(InvalidInputError,
                       match=r"^messages\[0\]: expected an aspect ratio of at most 200, got 2010x10"):
        processor.process(Image.new("RGB", (2010, 10)), "messages[0]")


def test_qwen_config_errors(tmp_path: Path) -> None:
    folder = _folder(tmp_path, QWEN_PRE)
    with pytest.raises(ModelLoadError,
                       match="merge_size 2 differs from config.json vision_config.spatial_merge_size 1"):
        image_processor(folder, {"model_type": "qwen2_vl", "vision_config": {"spatial_merge_size": 1}},
                        VisionBudget())
    with pytest.raises(ConfigError, match="min_pixels 20000000 > max_pixels 12845056"):
        image_processor(folder, {"model_type": "qwen2_vl"}, VisionBudget(min_pixels=20_000_000))
    with pytest.raises(ConfigError, match="min_pixels .* must be <= max_pixels"):
        VisionBudget(min_pixels=10, max_pixels=5)
    with pytest.raises(ConfigError, match="max_pixels must be a positive integer"):
        VisionBudget(max_pixels=0)


# --- GLM-4.1V ----------------------------------------------------------------------------------------

GLM_CASES = [  # image kind, (width, height), budget
    ("random", (224, 224), VisionBudget()),
    ("screen", (1080, 2400), VisionBudget()),  # the checkpoint's own bounds
    ("screen", (1080, 2400), VisionBudget(max_pixels=2 * 1024 * 28 * 28)),  # about 1,024 tokens
    ("random", (37, 500), VisionBudget()),
    ("random", (640, 480), VisionBudget(min_pixels=2 * 401_408, max_pixels=2 * 802_816)),
    ("random", (30, 30), VisionBudget()),  # below shortest_edge: upscaled
    ("screen", (1500, 10 * 28), VisionBudget(max_pixels=2 * 200_704)),
]


def _glm_size(budget: VisionBudget) -> dict:
    size = dict(GLM_PRE["size"])
    if budget.min_pixels is not None:
        size["shortest_edge"] = budget.min_pixels
    if budget.max_pixels is not None:
        size["longest_edge"] = budget.max_pixels
    return size


@pytest.mark.parametrize("kind, size, budget", GLM_CASES)
def test_glm_equals_transformers(tmp_path: Path, kind: str, size: tuple[int, int], budget: VisionBudget) -> None:
    processor = image_processor(_folder(tmp_path, GLM_PRE), {"model_type": "glm4v", "vision_config": QWEN_VISION},
                                budget)
    image = _image(kind, *size)
    ours = processor.process(image)
    reference = Glm4vImageProcessor(**GLM_PRE)(images=[image], return_tensors="np", size=_glm_size(budget))
    assert set(ours.feeds) == {"pixel_values", "image_grid_thw"}
    np.testing.assert_allclose(ours.feeds["pixel_values"], reference["pixel_values"], rtol=0, atol=1e-5)
    assert np.array_equal(ours.feeds["image_grid_thw"], reference["image_grid_thw"])
    assert ours.num_tokens == int(reference["image_grid_thw"][0].prod()) // 4 == processor.num_tokens(*size)
    assert ours.prompt_text == "<|image|>" * ours.num_tokens


PROMPT_CASES = {  # family: (preprocessor_config, two user turns with an image each, special tokens)
    "qwen2_vl": (QWEN_PRE, "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n"
                 "<|im_start|>user\nAnd <|vision_start|><|image_pad|><|vision_end|> here?<|im_end|>\n",
                 ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>", "<|im_start|>",
                  "<|im_end|>"]),
    "glm4v": (GLM_PRE, "[gMASK]<sop><|user|>\n<|begin_of_image|><|image|><|end_of_image|>What is this?"
              "<|user|>\nAnd <|begin_of_image|><|image|><|end_of_image|> here?<|assistant|>\n",
              ["<|begin_of_image|>", "<|image|>", "<|end_of_image|>", "<|video|>", "[gMASK]", "<sop>", "<|user|>",
               "<|assistant|>"]),
}


@pytest.mark.parametrize("family", sorted(PROMPT_CASES))
def test_prompt_equals_the_processor(tmp_path: Path, family: str) -> None:
    """Qwen2VLProcessor / Glm4vProcessor expand each image's placeholder to its token count."""
    pre, text, specials = PROMPT_CASES[family]
    budget = VisionBudget(max_pixels=100_000 if family == "qwen2_vl" else 200_000)
    processor = image_processor(_folder(tmp_path, pre), {"model_type": family}, budget)
    images = [_image("random", 300, 200), _image("screen", 108, 240, seed=1)]
    ours = processor.expand(text, [processor.process(image) for image in images])
    if family == "glm4v":
        tokenizer = _byte_tokenizer(PreTrainedTokenizerFast, specials)
        reference = _image_only(Glm4vProcessor)(image_processor=Glm4vImageProcessor(**GLM_PRE), tokenizer=tokenizer,
                                                video_processor=None)
        expected = reference(images=images, text=text, images_kwargs={"size": _glm_size(budget)})
    else:
        tokenizer = _byte_tokenizer(Qwen2TokenizerFast, specials)
        reference = _image_only(Qwen2VLProcessor)(image_processor=Qwen2VLImageProcessor(**QWEN_PRE),
                                                  tokenizer=tokenizer, video_processor=None)
        expected = reference(images=images, text=text, images_kwargs={"max_pixels": 100_000})
    assert tokenizer(ours)["input_ids"] == expected["input_ids"][0]
    assert tokenizer.decode(expected["input_ids"][0]) == ours
    assert ours.count(processor.placeholder) == sum(processor.process(image).num_tokens for image in images)


def test_glm_refuses_a_side_shorter_than_a_merged_patch(tmp_path: Path) -> None:
    """transformers raises ValueError for it; here it is the request's 400, naming the part."""
    processor = image_processor(_folder(tmp_path, GLM_PRE), {"model_type": "glm4v"}, VisionBudget())
    with pytest.raises(ValueError, match="must be larger than factor"):
        Glm4vImageProcessor(**GLM_PRE)(images=[Image.new("RGB", (300, 20))], return_tensors="np")
    with pytest.raises(InvalidInputError, match=r"^messages\[1\]: expected both sides at least 28 pixels, got 300x20"):
        processor.process(Image.new("RGB", (300, 20)), "messages[1]")
    with pytest.raises(InvalidInputError, match="at least 28 pixels"):
        processor.num_tokens(300, 20)


# --- Idefics3 / SmolVLM ----------------------------------------------------------------------------

IDEFICS_CASES = [  # family, image kind, (width, height), budget
    ("smolvlm", "screen", (1080, 2400), VisionBudget()),  # 4x2 tiles + global: 576 tokens
    ("smolvlm", "screen", (1080, 2400), VisionBudget(longest_edge=1024)),
    ("smolvlm", "random", (1080, 2400), VisionBudget(split_image=False)),
    ("smolvlm", "random", (700, 90), VisionBudget()),
    ("smolvlm", "random", (20, 20), VisionBudget(longest_edge=512)),  # exactly one tile after resizing
    ("smolvlm", "screen", (5000, 40), VisionBudget(longest_edge=5000)),  # over transformers' 4096 cap
    ("idefics3", "random", (640, 480), VisionBudget()),
    ("idefics3", "screen", (333, 777), VisionBudget(longest_edge=728, split_image=True)),
]


def _idefics_folder(tmp_path: Path, family: str) -> tuple[Path, dict]:
    if family == "smolvlm":
        return _folder(tmp_path, SMOLVLM_PRE, {"image_seq_len": 64}), SMOLVLM_CONFIG
    return _folder(tmp_path, IDEFICS3_PRE), IDEFICS3_CONFIG


@pytest.mark.parametrize("family, kind, size, budget", IDEFICS_CASES)
def test_idefics_equals_transformers(tmp_path: Path, family: str, kind: str, size: tuple[int, int],
                                     budget: VisionBudget) -> None:
    folder, config = _idefics_folder(tmp_path, family)
    processor = image_processor(folder, config, budget)
    image = _image(kind, *size)
    ours = processor.process(image)
    overrides = {}
    if budget.longest_edge is not None:
        overrides["size"] = {"longest_edge": budget.longest_edge}
    if budget.split_image is not None:
        overrides["do_image_splitting"] = budget.split_image
    cls = SmolVLMImageProcessor if family == "smolvlm" else Idefics3ImageProcessor
    pre = SMOLVLM_PRE if family == "smolvlm" else IDEFICS3_PRE
    reference = cls(**pre)(images=[image], return_tensors="np", return_row_col_info=True, **overrides)
    assert set(ours.feeds) == {"pixel_values", "pixel_attention_mask"}
    pixel_values, mask = ours.feeds["pixel_values"], ours.feeds["pixel_attention_mask"]
    assert pixel_values.dtype == np.float32 and mask.dtype == np.bool_
    assert pixel_values.shape == reference["pixel_values"].shape  # [1, tiles, 3, S, S]
    np.testing.assert_allclose(pixel_values, reference["pixel_values"], rtol=0, atol=1e-5)
    assert np.array_equal(mask, reference["pixel_attention_mask"].astype(bool))
    tiles = pixel_values.shape[1]
    rows, cols = reference["rows"][0][0], reference["cols"][0][0]
    assert tiles == (rows * cols + 1 if rows else 1)
    seq_len = 64 if family == "smolvlm" else 169
    assert ours.grid_thw is None
    assert ours.num_tokens == seq_len * tiles == ours.prompt_text.count("<image>")
    assert ours.num_tokens == processor.num_tokens(*size)
    if family == "smolvlm" and size == (1080, 2400) and budget == VisionBudget():
        assert (rows, cols, ours.num_tokens) == (4, 2, 576)


@pytest.mark.parametrize("family", ["idefics3", "smolvlm"])
def test_idefics_prompt_equals_the_processor(tmp_path: Path, family: str) -> None:
    folder, config = _idefics_folder(tmp_path, family)
    processor = image_processor(folder, config, VisionBudget(longest_edge=1024))
    images = [_image("random", 1000, 500), _image("screen", 300, 300, seed=1), _image("random", 200, 900)]
    text = "<|im_start|>User:<image>Describe.<end_of_utterance>\nUser: and<image><image>?<end_of_utterance>\n"
    ours = processor.expand(text, [processor.process(image) for image in images])
    tokenizer = _byte_tokenizer(PreTrainedTokenizerFast, ["<fake_token_around_image>", "<image>", "<global-img>",
                                                          "<end_of_utterance>", "<|im_start|>", *ROW_COL_TOKENS])
    pre = SMOLVLM_PRE if family == "smolvlm" else IDEFICS3_PRE
    # The Idefics3Processor writes the prompt; its text rule is also SmolVLMProcessor's (checked below).
    reference = Idefics3Processor(image_processor=Idefics3ImageProcessor(**pre), tokenizer=tokenizer,
                                  image_seq_len=processor.image_seq_len)
    expected = reference(images=images, text=text, images_kwargs={"size": {"longest_edge": 1024}})
    assert tokenizer(ours)["input_ids"] == expected["input_ids"][0]
    assert tokenizer.decode(expected["input_ids"][0]) == ours


def test_smolvlm_prompt_rule_equals_processing_smolvlm() -> None:
    """SmolVLM's processor module needs torchvision to import; run its prompt functions alone."""
    import transformers.models.smolvlm as package

    source = (Path(package.__file__).parent / "processing_smolvlm.py").read_text()
    wanted = {"_prompt_split_image", "_prompt_single_image", "get_image_prompt_string"}
    tree = ast.parse(source)
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in wanted]
    assert {node.name for node in functions} == wanted
    namespace: dict = {}
    exec(compile(ast.Module(body=functions, type_ignores=[]), "processing_smolvlm.py", "exec"), namespace)
    from edge_runtime.generation.vision.idefics_preprocess import image_prompt

    for rows, cols in [(0, 0), (1, 1), (4, 2), (2, 5), (6, 6)]:
        expected = namespace["get_image_prompt_string"](
            rows, cols, 64, fake_token_around_image="<fake_token_around_image>", image_token="<image>",
            global_image_token="<global-img>")
        assert image_prompt(rows, cols, 64) == expected


def test_idefics_config_errors(tmp_path: Path) -> None:
    folder = _folder(tmp_path, SMOLVLM_PRE, {"image_seq_len": 81})
    with pytest.raises(ModelLoadError, match="image_seq_len 81 differs from 64"):
        image_processor(folder, SMOLVLM_CONFIG, VisionBudget())
    with pytest.raises(ModelLoadError, match="max_image_size.longest_edge 512 differs from "
                                             "config.json vision_config.image_size 384"):
        image_processor(folder, {**SMOLVLM_CONFIG, "vision_config": {"image_size": 384, "patch_size": 16}},
                        VisionBudget())
    (folder / "processor_config.json").write_text(json.dumps({"image_seq_len": 64}))
    processor = image_processor(folder, {"model_type": "smolvlm"}, VisionBudget())  # no vision_config
    assert processor.image_seq_len == 64


# --- shared ----------------------------------------------------------------------------------------

def test_expand_counts_placeholders(tmp_path: Path) -> None:
    processor = image_processor(_folder(tmp_path, QWEN_PRE), {"model_type": "qwen2_vl"}, VisionBudget())
    one = processor.process(_image("random", 56, 56))
    with pytest.raises(InvalidInputError, match=r"^prompt: the prompt has 2 image placeholder\(s\) '<\|image_pad\|>' "
                                                r"but 1 image\(s\) were given"):
        processor.expand("<|image_pad|> and <|image_pad|>", [one])
    with pytest.raises(InvalidInputError, match="has 0 image placeholder"):
        processor.expand("no image here", [one])
    assert processor.expand("no image here", []) == "no image here"


def test_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="preprocessor_config.json: missing"):
        image_processor(tmp_path, {"model_type": "qwen2_vl"}, VisionBudget())
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="unreadable JSON"):
        image_processor(tmp_path, {"model_type": "qwen2_vl"}, VisionBudget())
    _folder(tmp_path, QWEN_PRE)
    with pytest.raises(ModelLoadError, match="no image preprocessing for model_type 'llava'"):
        image_processor(tmp_path, {"model_type": "llava"}, VisionBudget())


def test_prepare_image(tmp_path: Path) -> None:
    processor: ImageProcessor = image_processor(_folder(tmp_path, QWEN_PRE), {"model_type": "qwen2_5_vl"},
                                                VisionBudget(max_pixels=50_000))
    image = _image("screen", 108, 240)
    prepared = prepare_image(image, "messages[0].content[0]", ImageAccess(), processor)
    assert prepared.digest == image_digest(image)
    direct = processor.process(image)
    assert prepared.processed.num_tokens == direct.num_tokens
    assert np.array_equal(prepared.processed.feeds["pixel_values"], direct.feeds["pixel_values"])
    with pytest.raises(InvalidInputError, match=r"^messages\[0\].content\[0\]: expected a PNG"):
        prepare_image(b"nope", "messages[0].content[0]", ImageAccess(), processor)


def test_non_rgb_image_is_converted_first(tmp_path: Path) -> None:
    processor = image_processor(_folder(tmp_path, QWEN_PRE), {"model_type": "qwen2_vl"}, VisionBudget())
    image = _image("random", 84, 56).convert("RGBA")
    expected = Qwen2VLImageProcessor(**QWEN_PRE)(images=[image], return_tensors="np")["pixel_values"]
    np.testing.assert_allclose(processor.process(image).feeds["pixel_values"], expected, rtol=0, atol=1e-5)


# --- a request's own image budget (vLLM's mm_processor_kwargs, qwen-vl-utils' per-image keys) ------

QWEN_REQUEST_CASES = [  # the model's [vision] budget, the request's arguments, what transformers is given, size
    (VisionBudget(max_pixels=1024 * 28 * 28), {"max_pixels": 256 * 28 * 28}, {"max_pixels": 256 * 28 * 28},
     (1080, 2400)),
    (VisionBudget(), {"size": {"shortest_edge": 200_000, "longest_edge": 400_000}},
     {"min_pixels": 200_000, "max_pixels": 400_000}, (1080, 2400)),
    # min_pixels / max_pixels win over size; the model's own max_pixels stays where the request leaves it
    (VisionBudget(max_pixels=500_000), {"min_pixels": 300_000, "size": {"shortest_edge": 10}},
     {"min_pixels": 300_000, "max_pixels": 500_000}, (333, 777)),
]


@pytest.mark.parametrize("budget, kwargs, reference_kwargs, size", QWEN_REQUEST_CASES)
def test_a_request_budget_equals_transformers_given_the_same_arguments(
        tmp_path: Path, budget: VisionBudget, kwargs: dict, reference_kwargs: dict, size: tuple[int, int]) -> None:
    model = image_processor(_folder(tmp_path, QWEN_PRE), {"model_type": "qwen2_vl", "vision_config": QWEN_VISION},
                            budget)
    processor = model.with_budget(model.request_budget(kwargs, "mm_processor_kwargs"))
    assert processor is not model and processor.tag and processor.tag != model.tag
    image = _image("screen", *size)
    ours = processor.process(image)
    reference = Qwen2VLImageProcessor(**QWEN_PRE)(images=[image], return_tensors="np", **reference_kwargs)
    np.testing.assert_allclose(ours.feeds["pixel_values"], reference["pixel_values"], rtol=0, atol=1e-5)
    assert ours.grid_thw == tuple(int(v) for v in reference["image_grid_thw"][0])
    assert ours.num_tokens == processor.num_tokens(*size) != model.num_tokens(*size)


@pytest.mark.parametrize("kwargs, reference_kwargs", [
    ({"size": {"longest_edge": 1024}, "do_image_splitting": False},
     {"size": {"longest_edge": 1024}, "do_image_splitting": False}),
    ({"longest_edge": 1536}, {"size": {"longest_edge": 1536}}),  # [vision]'s own name
])
def test_a_smolvlm_request_budget_equals_transformers(tmp_path: Path, kwargs: dict, reference_kwargs: dict) -> None:
    folder, config = _idefics_folder(tmp_path, "smolvlm")
    model = image_processor(folder, config, VisionBudget())
    processor = model.with_budget(model.request_budget(kwargs, "mm_processor_kwargs"))
    image = _image("screen", 1080, 2400)
    ours = processor.process(image)
    reference = SmolVLMImageProcessor(**SMOLVLM_PRE)(images=[[image]], return_tensors="np", **reference_kwargs)
    np.testing.assert_allclose(ours.feeds["pixel_values"], reference["pixel_values"], rtol=0, atol=1e-5)
    assert ours.num_tokens == processor.num_tokens(1080, 2400) != model.num_tokens(1080, 2400)


def test_a_request_budget_equal_to_the_models_is_the_models_processor(tmp_path: Path) -> None:
    model = image_processor(_folder(tmp_path, QWEN_PRE), {"model_type": "qwen2_vl"}, VisionBudget(max_pixels=50_000))
    same = model.with_budget(model.request_budget({"max_pixels": 50_000, "min_pixels": QWEN_PRE["min_pixels"]}, "x"))
    assert same is model and same.tag == b""  # so its images share the cache entries of requests without one
    image = _image("screen", 108, 240)
    smaller = model.with_budget(VisionBudget(max_pixels=20_000))
    assert prepare_image(image, "x", ImageAccess(), model).digest == image_digest(image)
    assert prepare_image(image, "x", ImageAccess(), smaller).digest != image_digest(image)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_pixels": 0}, r"^mm_processor_kwargs: max_pixels must be a positive integer, got 0"),
    ({"max_pixels": "big"}, r"^mm_processor_kwargs: max_pixels must be a positive integer, got 'big'"),
    ({"min_pixels": 9, "max_pixels": 5}, r"^mm_processor_kwargs: min_pixels \(9\) must be <= max_pixels \(5\)"),
    ({"longest_edge": 512}, r"^mm_processor_kwargs: unknown image processor argument\(s\) \['longest_edge'\] for "
                            r"qwen2_vl; known: \['min_pixels', 'max_pixels', 'size'\]"),
    ({"size": {"height": 5}}, r"^mm_processor_kwargs.size must be \{'shortest_edge'"),
    ([1], r"^mm_processor_kwargs must be an object of image processor arguments"),
])
def test_bad_request_budgets_are_named(tmp_path: Path, kwargs, message: str) -> None:
    model = image_processor(_folder(tmp_path, QWEN_PRE), {"model_type": "qwen2_vl"}, VisionBudget())
    with pytest.raises(InvalidInputError, match=message):
        model.request_budget(kwargs, "mm_processor_kwargs")
    # bounds that cross only once the model's own are added
    with pytest.raises(InvalidInputError, match=r"^messages\[1\].content\[0\]: min_pixels 13000000 > max_pixels "):
        model.with_budget(VisionBudget(min_pixels=13_000_000), "messages[1].content[0]")
    # the model's budget is the ceiling of a request's
    capped = model.with_budget(VisionBudget(max_pixels=100_000))
    with pytest.raises(InvalidInputError, match=r"^x: max_pixels 200000 is over this model's image budget of 100000 "
                                                r"pixels \(its \[vision\] max_pixels caps a request's\)"):
        capped.with_budget(VisionBudget(max_pixels=200_000), "x")
    assert capped.with_budget(VisionBudget(min_pixels=100_000), "x").num_tokens(20, 20) > capped.num_tokens(20, 20)


def test_a_smolvlm_request_stays_within_the_models_budget(tmp_path: Path) -> None:
    folder, config = _idefics_folder(tmp_path, "smolvlm")
    model = image_processor(folder, config, VisionBudget(longest_edge=1024, split_image=False))
    with pytest.raises(InvalidInputError, match=r"^x: longest_edge 1536 is over this model's image budget of 1024"):
        model.with_budget(model.request_budget({"size": {"longest_edge": 1536}}, "mm"), "x")
    with pytest.raises(InvalidInputError, match=r"^x: image splitting is off in this model's image budget"):
        model.with_budget(model.request_budget({"do_image_splitting": True}, "mm"), "x")
    assert model.with_budget(VisionBudget(longest_edge=512), "x").num_tokens(1080, 2400) == model.image_seq_len


def test_an_image_over_the_context_is_refused_before_it_is_resized(tmp_path: Path) -> None:
    model = image_processor(_folder(tmp_path, QWEN_PRE), {"model_type": "qwen2_vl"}, VisionBudget())
    huge = model.with_budget(VisionBudget(min_pixels=10_000_000, max_pixels=10_000_000))
    with pytest.raises(InvalidInputError, match=r"^x: a 20x20 image is \d+ image tokens under its image budget, "
                                                r"more than the model's context of 4096 tokens"):
        prepare_image(_image("random", 20, 20), "x", ImageAccess(), huge, max_tokens=4096)
