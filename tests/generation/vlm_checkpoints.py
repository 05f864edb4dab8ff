"""Tiny random-weight transformers VLM checkpoints for the converter tests, and a host loop over ONNX parts.

``checkpoint(spec, root)`` builds a ``*ForConditionalGeneration`` model with torch
from a fixed seed (weights redrawn at a larger std than transformers' 0.02 so greedy
output varies, non-trivial norms and biases so a dropped one fails the oracles),
saves it with ``save_pretrained`` and adds a locally trained tokenizer, chat template
and ``preprocessor_config.json``. Cached under ``root`` keyed by the spec (and
``FIXTURE_VERSION``). ``vlm_root`` is ``$EDGE_RUNTIME_TEST_MODELS`` when set, else a
temporary folder.

Qwen2-VL's processor needs torchvision (its video processor), which is not
installable here, so ``qwen_inputs`` follows the processor's rule by hand: the slow
``Qwen2VLImageProcessor`` for pixels and grid, the tokenizer's chat template for the
prompt, each ``<|image_pad|>`` repeated t*h*w/merge² times.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

FIXTURE_VERSION = 1
QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl")
MROPE_FAMILIES = (*QWEN_FAMILIES, "glm4v", "qwen3_vl")  # decoder position_ids [3, batch, seq]


@dataclass(frozen=True)
class VLMSpec:
    family: str = "qwen2_vl"
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    vocab: int = 512
    vision_depth: int = 2
    vision_dim: int = 32
    vision_heads: int = 4
    image_size: int = 32          # idefics3/smolvlm: the tile side; glm4v: the position table's (x 14)
    longest_edge: int = 64        # idefics3/smolvlm: resize target before splitting
    split: bool = True            # idefics3/smolvlm: do_image_splitting
    seed: int = 0
    head_dim: int = 0             # qwen3_vl: text head size (0: hidden / heads)

    @property
    def key(self) -> str:
        fields = {k: v for k, v in asdict(self).items() if not (k == "head_dim" and v == 0)}  # keys before it stay
        blob = json.dumps({**fields, "v": FIXTURE_VERSION}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


# Qwen3-VL-4B's head geometry: text heads of 128 channels on a narrower hidden size (2560 / 32 heads would be
# 80), M-RoPE [24, 20, 20] interleaved; vision heads of 64; a 48x48 position table; three DeepStack sets
QWEN3_4B_HEADS = VLMSpec(family="qwen3_vl", seed=9, hidden=160, heads=2, kv_heads=1, head_dim=128, layers=3,
                         intermediate=256, vision_dim=128, vision_heads=2, vision_depth=3, image_size=768)


def vlm_root(tmp_path_factory) -> Path:
    root = os.environ.get("EDGE_RUNTIME_TEST_MODELS")
    if root:
        path = Path(root) / "vlm"
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("vlm")


def _redraw(model, seed: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))
            elif "norm" in name or name.endswith("ln_q.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=generator))
            elif "patch_embed" in name or "mlp.2" in name or "patch_embedding" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=generator))


def _qwen_model(spec: VLMSpec, ids: dict[str, int]):
    import transformers

    text = dict(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
                max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
                bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
    tokens = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                  vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                  tie_word_embeddings=True)
    if spec.family == "qwen2_5_vl":  # windows of 2x2 merge blocks, the last block attends fully
        vision = dict(depth=spec.vision_depth, hidden_size=spec.vision_dim, num_heads=spec.vision_heads,
                      intermediate_size=2 * spec.vision_dim, out_hidden_size=spec.hidden, window_size=56,
                      fullatt_block_indexes=[spec.vision_depth - 1])
        config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **tokens)
        return transformers.Qwen2_5_VLForConditionalGeneration(config)
    vision = dict(depth=spec.vision_depth, embed_dim=spec.vision_dim, num_heads=spec.vision_heads, mlp_ratio=4,
                  hidden_size=spec.hidden)
    config = transformers.Qwen2VLConfig(text_config=text, vision_config=vision, **tokens)
    return transformers.Qwen2VLForConditionalGeneration(config)


def _glm_model(spec: VLMSpec, ids: dict[str, int]):
    """GLM-4.1V's architecture at a tiny size: half the head's channels rotated (partial_rotary_factor
    0.5, interleaved M-RoPE split over t/h/w as GLM's [8, 12, 12] is), a learned position table of
    (image_size / 14)² entries interpolated to each image's grid."""
    import transformers

    from edge_runtime.vlm_zoo import glm_mrope_section

    if spec.image_size % 14:
        raise ValueError(f"glm4v: image_size {spec.image_size} is not a multiple of the 14-px patch")
    text = dict(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
                max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                partial_rotary_factor=0.5, rope_scaling={"rope_type": "default", "mrope_section": list(
                    glm_mrope_section(spec.hidden // spec.heads // 4))},
                eos_token_id=[ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]],
                pad_token_id=ids["<|endoftext|>"])
    vision = dict(depth=spec.vision_depth, hidden_size=spec.vision_dim, num_heads=spec.vision_heads,
                  out_hidden_size=spec.hidden, intermediate_size=2 * spec.hidden, image_size=spec.image_size,
                  patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, rms_norm_eps=1e-5)
    config = transformers.Glm4vConfig(
        text_config=text, vision_config=vision, image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"], image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"], video_end_token_id=ids["<|end_of_video|>"],
        tie_word_embeddings=False)
    return transformers.Glm4vForConditionalGeneration(config)


def _qwen3_model(spec: VLMSpec, ids: dict[str, int]):
    """Qwen3-VL's architecture at a tiny size: 16-px patches, a (image_size / 16)² position table interpolated
    to each grid, DeepStack sets from the first two vision blocks added after the first two text layers,
    q/k norms and interleaved M-RoPE in the text model."""
    import transformers

    head_dim = spec.head_dim or spec.hidden // spec.heads
    section = [24, 20, 20] if head_dim == 128 else [2, 3, 3]  # Qwen3-VL's own split of 64 frequencies, or of 8
    text = dict(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
                head_dim=head_dim, max_position_embeddings=4096, rms_norm_eps=1e-6,
                rope_theta=5000000.0, tie_word_embeddings=True, attention_bias=False,
                rope_scaling={"rope_type": "default", "mrope_interleaved": True, "mrope_section": section},
                bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
    vision = dict(depth=spec.vision_depth, hidden_size=spec.vision_dim, num_heads=spec.vision_heads,
                  intermediate_size=2 * spec.vision_dim, out_hidden_size=spec.hidden, patch_size=16,
                  num_position_embeddings=(spec.image_size // 16) ** 2,
                  deepstack_visual_indexes=list(range(min(3, spec.vision_depth, spec.layers))))
    config = transformers.Qwen3VLConfig(
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=True)
    return transformers.Qwen3VLForConditionalGeneration(config)


def _idefics_model(spec: VLMSpec, ids: dict[str, int]):
    import transformers

    text = dict(model_type="llama", vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
                max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=False,
                bos_token_id=ids["<|im_start|>"], eos_token_id=ids["<end_of_utterance>"],
                pad_token_id=ids["<|im_end|>"])
    vision = dict(num_hidden_layers=spec.vision_depth, hidden_size=spec.vision_dim,
                  num_attention_heads=spec.vision_heads, intermediate_size=2 * spec.vision_dim,
                  image_size=spec.image_size, patch_size=4)
    if spec.family == "smolvlm":
        config = transformers.SmolVLMConfig(text_config=text, vision_config=vision, image_token_id=ids["<image>"],
                                            scale_factor=2, tie_word_embeddings=False, pad_token_id=ids["<|im_end|>"])
        return transformers.SmolVLMForConditionalGeneration(config)
    config = transformers.Idefics3Config(text_config=text, vision_config=vision, image_token_id=ids["<image>"],
                                         scale_factor=2, tie_word_embeddings=False, pad_token_id=ids["<|im_end|>"])
    return transformers.Idefics3ForConditionalGeneration(config)


def checkpoint(spec: VLMSpec, root: Path) -> Path:
    """The saved checkpoint folder (built once per spec under ``root``)."""
    out = Path(root) / f"hf-{spec.family}-{spec.key}"
    if (out / "done").is_file():
        return out
    import torch
    import transformers

    from edge_runtime.vlm_files import (glm_preprocessor_config, idefics_preprocessor_config, qwen_preprocessor_config,
                                        write_vlm_text_files)

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    ids = write_vlm_text_files(tmp, spec.family, spec.vocab, spec.seed)
    torch.manual_seed(spec.seed)
    if spec.family in ("qwen2_vl", "qwen2_5_vl"):
        model = _qwen_model(spec, ids)
        processor = qwen_preprocessor_config(spec.family, 56 * 56, 28 * 28 * 64)
        eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    elif spec.family == "qwen3_vl":
        model = _qwen3_model(spec, ids)
        processor = qwen_preprocessor_config(spec.family, 64 * 64, 32 * 32 * 64, patch=16)
        eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    elif spec.family == "glm4v":
        model = _glm_model(spec, ids)
        processor = glm_preprocessor_config(2 * 56 * 56, 2 * 28 * 28 * 64)  # GLM counts both temporal frames
        eos = [ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]]
    elif spec.family in ("idefics3", "smolvlm"):
        model = _idefics_model(spec, ids)
        processor = idefics_preprocessor_config(spec.family, spec.image_size, spec.longest_edge, spec.split)
        seq_len = (spec.image_size // 4) ** 2 // 4
        (tmp / "processor_config.json").write_text(json.dumps(
            {"image_seq_len": seq_len, "processor_class": processor["processor_class"]}))
        eos = [ids["<end_of_utterance>"]]
    else:
        raise ValueError(f"no checkpoint builder for {spec.family!r}")
    model.eval()
    _redraw(model, spec.seed)
    model.save_pretrained(tmp)
    (tmp / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
    transformers.GenerationConfig(eos_token_id=eos, do_sample=False).save_pretrained(tmp)
    (tmp / "done").write_text("ok")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def load_model(folder: Path):
    import transformers

    return transformers.AutoModelForImageTextToText.from_pretrained(folder, torch_dtype="float32").eval()


def sample_image(width: int = 84, height: int = 56, seed: int = 0):
    """A noisy RGB image whose sides are multiples of 28 (no resize: PIL and sharp agree exactly)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    base = np.linspace(0, 255, width, dtype=np.float32)[None, :, None] * np.ones((height, 1, 3), np.float32)
    pixels = np.clip(base + rng.normal(0, 40, (height, width, 3)), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def model_inputs(family: str, folder: Path, image, text: str) -> dict[str, np.ndarray]:
    if family in MROPE_FAMILIES:
        return qwen_inputs(folder, image, text, glm=family == "glm4v")
    return idefics_inputs(folder, image, text)


def idefics_inputs(folder: Path, image, text: str) -> dict[str, np.ndarray]:
    """input_ids, attention_mask, pixel_values, pixel_attention_mask from transformers' Idefics3Processor.

    SmolVLMProcessor needs torchvision (video); its prompt expansion is Idefics3's, and SmolVLM's
    image processor gives the pixels (checked equal to Idefics3's here)."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    settings = json.loads((folder / "processor_config.json").read_text())
    processor = transformers.Idefics3Processor(
        image_processor=transformers.Idefics3ImageProcessor.from_pretrained(folder), tokenizer=tokenizer,
        image_seq_len=settings["image_seq_len"], chat_template=tokenizer.chat_template)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    out = dict(processor(text=[prompt], images=[[image]], return_tensors="np"))
    config = json.loads((folder / "preprocessor_config.json").read_text())
    if config["image_processor_type"] == "SmolVLMImageProcessor":
        smol = transformers.SmolVLMImageProcessor.from_pretrained(folder)(images=[[image]], return_tensors="np")
        np.testing.assert_array_equal(smol["pixel_values"], out["pixel_values"])
        np.testing.assert_array_equal(smol["pixel_attention_mask"], out["pixel_attention_mask"])
    return {"input_ids": out["input_ids"].astype(np.int64), "attention_mask": out["attention_mask"].astype(np.int64),
            "pixel_values": out["pixel_values"].astype(np.float32),
            "pixel_attention_mask": out["pixel_attention_mask"].astype(bool)}


def qwen_inputs(folder: Path, image, text: str, glm: bool = False) -> dict[str, np.ndarray]:
    """input_ids, attention_mask, pixel_values, image_grid_thw for one user turn (image, then text).

    ``glm``: GLM-4.1V's slow ``Glm4vImageProcessor`` and ``<|image|>`` placeholder (its processor class
    wants torchvision for video too, so its expansion rule, the same as Qwen's, is followed here)."""
    import transformers

    image_processor = transformers.Glm4vImageProcessor if glm else transformers.Qwen2VLImageProcessor
    processor = image_processor.from_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    pixels = processor(images=[image], return_tensors="np")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    count = int(np.prod(pixels["image_grid_thw"][0])) // processor.merge_size ** 2
    placeholder = "<|image|>" if glm else "<|image_pad|>"
    prompt = prompt.replace(placeholder, placeholder * count)
    ids = np.array([tokenizer(prompt)["input_ids"]], np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "pixel_values": pixels["pixel_values"],
            "image_grid_thw": pixels["image_grid_thw"].astype(np.int64)}


def patch_values(family: str) -> int:
    """Values per row of ``pixel_values`` of an M-RoPE family: 3 channels x 2 frames x patch²."""
    return 3 * 2 * (16 if family == "qwen3_vl" else 14) ** 2


def deepstack_sets(family: str) -> int:
    """DeepStack feature sets a test checkpoint of ``family`` has (Qwen3-VL: from its first two blocks)."""
    return 2 if family == "qwen3_vl" else 0


def widened(visual):
    """transformers' vision output as our encoder writes it: Qwen3-VL's (merger rows, DeepStack sets) side by
    side along the channels; other families' features as they are."""
    import torch

    if isinstance(visual, tuple):
        main, sets = visual
        return torch.cat([main, *sets], dim=-1)
    return visual


def session(folder: Path, part: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(folder / "onnx" / f"{part}.onnx"), options, providers=["CPUExecutionProvider"])


def empty_past(config: dict, batch: int) -> dict[str, np.ndarray]:
    text = config.get("text_config", config)
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    return {f"past_key_values.{n}.{kind}": np.zeros((batch, text["num_key_value_heads"], 0, head_dim), np.float32)
            for n in range(text["num_hidden_layers"]) for kind in ("key", "value")}


def vision_feeds(family: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if family in MROPE_FAMILIES:
        grid_name = "grid_thw" if family == "qwen2_vl" else "image_grid_thw"
        return {"pixel_values": inputs["pixel_values"], grid_name: inputs["image_grid_thw"]}
    return {"pixel_values": inputs["pixel_values"], "pixel_attention_mask": inputs["pixel_attention_mask"]}


def onnx_greedy(family: str, folder: Path, model, inputs: dict[str, np.ndarray], max_new: int,
                suffix: str = "") -> list[int]:
    """The host loop over our three parts (``suffix``: ``""`` or ``"_fp16"``): embed, encode, splice at
    image_token_id, prefill, decode. Qwen positions come from transformers' ``get_rope_index``."""
    import torch

    config = json.loads((folder / "config.json").read_text())
    eos = set(json.loads((folder / "generation_config.json").read_text())["eos_token_id"])
    ids = inputs["input_ids"]
    embeds = session(folder, "embed_tokens" + suffix).run(None, {"input_ids": ids})[0]
    features = session(folder, "vision_encoder" + suffix).run(None, vision_feeds(family, inputs))[0]
    features = features.reshape(-1, features.shape[-1])
    rows = ids[0] == config["image_token_id"]
    assert rows.sum() == len(features)
    embeds[0, rows] = features
    length, delta = ids.shape[1], 0
    if family in MROPE_FAMILIES:
        with torch.no_grad():  # transformers' get_rope_index: the positions oracle (the engine has its own)
            positions, deltas = model.model.get_rope_index(
                input_ids=torch.from_numpy(ids), image_grid_thw=torch.from_numpy(inputs["image_grid_thw"]),
                attention_mask=torch.from_numpy(inputs["attention_mask"]))
        positions, delta = positions.numpy(), int(deltas[0, 0])
    else:
        positions = np.arange(length, dtype=np.int64)[None]
    decoder, embed = session(folder, "decoder_model_merged" + suffix), session(folder, "embed_tokens" + suffix)
    names = [o.name for o in decoder.get_outputs()]
    feeds = {"inputs_embeds": embeds, "attention_mask": np.ones_like(ids), "position_ids": positions,
             **empty_past(config, 1)}
    tokens: list[int] = []
    while True:
        outputs = dict(zip(names, decoder.run(None, feeds)))
        token = int(np.argmax(outputs["logits"][0, -1]))
        tokens.append(token)
        if token in eos or len(tokens) == max_new:
            return tokens
        past = {k.replace("present", "past_key_values"): v for k, v in outputs.items() if k.startswith("present")}
        position = np.full((3, 1, 1) if family in MROPE_FAMILIES else (1, 1), length + delta, np.int64)
        feeds = {"inputs_embeds": embed.run(None, {"input_ids": np.array([[token]], np.int64)})[0],
                 "attention_mask": np.ones((1, length + 1), np.int64), "position_ids": position, **past}
        length += 1


def zoo_checkpoint(zoo: Path, family: str, seed: int, out: Path, shape=None) -> Path:
    """A transformers checkpoint of a ``write_vlm_folder`` folder (of ``shape``, default ``VLMShape()``): its
    config, tokenizer and processor files plus ``random_vlm_weights`` as ``model.safetensors``, so
    transformers can load the same model."""
    from safetensors.numpy import save_file

    from edge_runtime.vlm_zoo import VLMShape, random_vlm_weights

    out.mkdir(parents=True, exist_ok=True)
    for item in zoo.iterdir():
        if item.is_file():
            shutil.copyfile(item, out / item.name)
    save_file(random_vlm_weights(family, shape or VLMShape(), seed), str(out / "model.safetensors"))
    return out
