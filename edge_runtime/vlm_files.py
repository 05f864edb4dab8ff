"""The non-ONNX files of a tiny VLM folder: tokenizer with the family's special tokens, chat template, processor.

``write_vlm_text_files(folder, family, vocab, seed, ...)`` trains a byte-level BPE
tokenizer locally (``edge_runtime.tokenizer_zoo``) with the special tokens the family's
processor looks up, writes ``tokenizer_config.json`` with a chat template of the family's
format (our own wording of it), and returns the special token ids the config needs.
``preprocessor_config(family, ...)`` is the processor's file as transformers saves it,
readable by transformers' and transformers.js's image processors alike.
"""

from __future__ import annotations

import json
from pathlib import Path

QWEN_SPECIALS = ("<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                 "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                 "<|video_pad|>")
# GLM-4.1V (glm4v): its role tokens, image and video brackets, and the [gMASK]<sop> prefix
GLM_SPECIALS = ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
                "<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>",
                "<|video|>")
# SmolVLM/Idefics3: tile tokens <row_r_col_c> for up to 6x6 tiles, as the released processors have
IDEFICS_SPECIALS = ("<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>",
                    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)))

# ChatML with each image part as <|vision_start|><|image_pad|><|vision_end|> and Qwen's default
# system turn; the processor expands <|image_pad|> to the image's token count.
QWEN_VL_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or part['type'] == 'image_url' -%}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")

# GLM-4's format: "[gMASK]<sop>" once, then "<|role|>\n" + content per turn, each image part as
# <|begin_of_image|><|image|><|end_of_image|>; the processor expands <|image|> to the image's token count.
GLM_TEMPLATE = (
    "{{ '[gMASK]<sop>' }}"
    "{%- for message in messages -%}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or part['type'] == 'image_url' -%}"
    "{{ '<|begin_of_image|><|image|><|end_of_image|>' }}"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}")

# SmolVLM's format: "<|im_start|>User:<image>text<end_of_utterance>\nAssistant:"; a turn that
# opens with an image has no space after the colon.
IDEFICS_TEMPLATE = (
    "{{ '<|im_start|>' }}"
    "{%- for message in messages -%}"
    "{{ message['role'] | capitalize }}"
    "{%- if message['content'] is string -%}{{ ': ' + message['content'] }}"
    "{%- else -%}"
    "{%- if message['content'][0]['type'] == 'image' or message['content'][0]['type'] == 'image_url' -%}"
    "{{ ':' }}{%- else -%}{{ ': ' }}{%- endif -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or part['type'] == 'image_url' -%}{{ '<image>' }}"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_utterance>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'Assistant:' }}{%- endif -%}")

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def write_vlm_text_files(folder: Path, family: str, vocab: int, seed: int = 0,
                         max_positions: int = 2048) -> dict[str, int]:
    """Tokenizer files and chat template; returns the ids of the special tokens by name."""
    from tokenizers import Tokenizer

    from edge_runtime.tokenizer_zoo import _train

    folder = Path(folder)
    from edge_runtime.generation.vision.families import FAMILIES

    qwen = FAMILIES[family].preprocessing == "qwen"
    extra = (QWEN_SPECIALS if qwen else GLM_SPECIALS if family == "glm4v"
             else ("<|im_start|>", "<|im_end|>", *IDEFICS_SPECIALS))
    specials = _train(folder, vocab, "qwen2", seed, extra)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = {s: tokenizer.token_to_id(s) for s in specials}
    if qwen:
        config = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                  "bos_token": None, "add_bos_token": False, "chat_template": QWEN_VL_TEMPLATE}
    elif family == "glm4v":
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                  "pad_token": "<|endoftext|>", "bos_token": None, "add_bos_token": False,
                  "chat_template": GLM_TEMPLATE}
    else:
        config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|im_start|>", "eos_token": "<end_of_utterance>",
                  "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>", "add_bos_token": False,
                  "chat_template": IDEFICS_TEMPLATE,
                  "additional_special_tokens": ["<fake_token_around_image>", "<image>", "<end_of_utterance>"]}
    config.update({"model_max_length": max_positions, "clean_up_tokenization_spaces": False})
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {k: v for k, v in config.items() if (k.endswith("_token") or k.endswith("_tokens")) and v}, indent=2))
    return ids


def qwen_preprocessor_config(family: str, min_pixels: int, max_pixels: int, patch: int = 14, merge: int = 2,
                             temporal: int = 2) -> dict:
    """Qwen2VLImageProcessor's file; Qwen3-VL's normalises with mean and std 0.5 (its patch size is the caller's)."""
    mean, std = ([0.5] * 3, [0.5] * 3) if family == "qwen3_vl" else (CLIP_MEAN, CLIP_STD)
    processor = {"qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}.get(family, "Qwen2VLProcessor")
    return {"image_processor_type": "Qwen2VLImageProcessor", "processor_class": processor,
            "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "do_convert_rgb": True, "resample": 3, "image_mean": mean, "image_std": std,
            "min_pixels": min_pixels, "max_pixels": max_pixels,
            "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels},
            "patch_size": patch, "temporal_patch_size": temporal, "merge_size": merge}


def glm_preprocessor_config(min_pixels: int, max_pixels: int, patch: int = 14, merge: int = 2,
                            temporal: int = 2) -> dict:
    """Glm4vImageProcessor's file: its bounds live in ``size`` only (``shortest_edge`` / ``longest_edge``,
    compared with temporal_patch_size x height x width)."""
    return {"image_processor_type": "Glm4vImageProcessor", "processor_class": "Glm4vProcessor",
            "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "do_convert_rgb": True, "resample": 3, "image_mean": CLIP_MEAN, "image_std": CLIP_STD,
            "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels},
            "patch_size": patch, "temporal_patch_size": temporal, "merge_size": merge}


def idefics_preprocessor_config(family: str, image_size: int, longest_edge: int, split: bool) -> dict:
    name = "SmolVLM" if family == "smolvlm" else "Idefics3"
    return {"image_processor_type": f"{name}ImageProcessor", "processor_class": f"{name}Processor",
            "do_convert_rgb": True, "do_resize": True, "size": {"longest_edge": longest_edge}, "resample": 1,
            "do_image_splitting": split, "max_image_size": {"longest_edge": image_size},
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_pad": True}
