"""Benchmark: a phone-agent episode on a vision-language model, edge-runtime against transformers (PyTorch, CPU).

Model: a Qwen2-VL with random weights built with ``transformers`` (vision depth 8,
width 384; text hidden 512, 8 layers, GQA 8/2, vocab 4096), or with ``--family glm4v`` a
GLM-4.1V (AutoGLM-Phone's architecture) of the same sizes (half of each text head rotated,
a 24x24 position table; its image bounds count two frames, so the budgets are doubled
to give the same image tokens), or with ``--family qwen3_vl`` a Qwen3-VL of the same sizes
(16-px patches, a 48x48 position table, DeepStack sets from vision blocks 1, 3 and 5 into the
first three text layers, q/k norms; budgets in 32x32-pixel tokens), saved as a checkpoint
and converted by ``edge_runtime.vision_convert`` (``edge-runtime convert``) into the
transformers.js layout, so both sides run the same weights; the vision encoder with the
converter's default fused attention (ONNX Runtime's MultiHeadAttention, flash attention
for one image), the decoder as GroupQueryAttention (M-RoPE rotated before it). Same
intra-op threads.

Episode: 5 steps, each a chat request of a ~1,500-token phone-agent system prompt,
the text history of the earlier steps (their screenshots stripped, as agents do)
and a new 1080x2400 screenshot; 16 new tokens, greedy. At two image budgets
(``max_pixels`` of about 256 and 1,024 image tokens). Per step: time to first token
split into image decode + preprocess, vision encode, prefill and first token (edge-
runtime's ``GenerationResult.timings``; transformers': its slow image processor,
then ``generate`` with a streamer noting each token's time), cached prompt tokens,
and decode tokens/s.

``--precision decoder=q8,vision_encoder=q8`` adds a third side: edge-runtime on the quantized
parts ``convert --quantize`` writes (transformers.js suffixes; written into the cached folder
when missing), reported apart as ``edge_runtime_quantized`` / ``ttft_ratio_quantized`` — the
transformers side stays fp32, so that ratio is not an fp32 comparison.

``--keep-images N`` keeps the screenshots of the last N user turns in the history (UI-TARS-style
agents keep up to five) instead of only the newest: each step then resends N - 1 screenshots the
model has seen, after a history whose oldest screenshot was just stripped, so the prefix cache holds
only the text before it; edge-runtime's image feature cache (``[vision] feature_cache_bytes``) spares
their encoder runs (``images_cached`` per step), transformers encodes every image of every request.

After the episode, the same warm models take the first step of a next episode (the same system
prompt, a new screenshot): row ``step`` "1 (next episode)". A daemon serves many episodes, and
from the second on its prefix cache holds the system prompt; the episode's own step 1 is the
cold start of a fresh model. Then the models are closed and loaded anew, as a restarted daemon
is, and take one more episode's first step: row "1 (after a restart)", where the prefix cache's
blocks come back from disk (``[generation] prefix_cache_disk_bytes``, on here). transformers
recomputes everything at every step either way.

Rounds interleave the sides step by step; each figure is the best of its rounds.
Goals (issue 22): time to first token <= 0.5x transformers' at every step; steps 2-5
prefill only their new tokens (prefix-cache hits). Prints JSON, writes a PNG.

Each row also has ``fp32_floor`` (``tools/vlm_floor.py``): the matrix FLOPs of what edge-runtime's
step had to compute (the screenshots its feature cache did not hold, counted on transformers' own
tower; the prompt tokens its prefix cache did not) at the best fp32 GEMM rate measured in the same
run (``fp32_gemm_gflops``: ONNX Runtime's and PyTorch's, before and after each budget's rounds),
and that time over transformers' TTFT. No fp32 engine gets below it; where its ratio is above 0.5
the goal is out of reach in fp32 here.

Usage: ``python tools/bench_vlm.py [--family qwen2_vl|glm4v|qwen3_vl] [--quick] [--threads 2] [--rounds 2]
[--precision PART=NAME,...] [--keep-images 1] [--out bench-results/vlm]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tools"):
    if str(_path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(_path))

from vlm_floor import floor_ms, gemm_peak_gflops, text_prefill_flops, vision_flops  # noqa: E402

TEXT = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
            intermediate_size=1408, max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=1000000.0,
            tie_word_embeddings=True, rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]})
VISION = dict(depth=8, embed_dim=384, num_heads=6, mlp_ratio=4, hidden_size=512)
VOCAB = 4096
BUDGETS = {"256": 256, "1024": 1024}  # image tokens; max_pixels = tokens x PIXELS_PER_TOKEN
# an image token is a 2x2 merge of patches: 28x28 pixels (14-px patches), 32x32 for Qwen3-VL; GLM's max_pixels
# bounds temporal_patch_size x height x width: twice the pixels of a still image
PIXELS_PER_TOKEN = {"qwen2_vl": 28 * 28, "glm4v": 2 * 28 * 28, "qwen3_vl": 32 * 32}
PLACEHOLDER = {"qwen2_vl": "<|image_pad|>", "glm4v": "<|image|>", "qwen3_vl": "<|image_pad|>"}
STEP_TEXT = ["Open the settings app.", "Go to the network settings.", "Turn on Wi-Fi.",
             "Pick the network named home.", "Confirm and go back."]
ANSWER = "do(action=\"Tap\", element=[540, 1200])"


def _model(family: str, depth: int, ids: dict[str, int]) -> Any:
    """The random-weight transformers model of ``family`` at the benchmark's sizes."""
    import transformers

    if family == "glm4v":
        from edge_runtime.vlm_zoo import glm_mrope_section

        head = TEXT["hidden_size"] // TEXT["num_attention_heads"]
        text = {**TEXT, "vocab_size": VOCAB, "tie_word_embeddings": False, "partial_rotary_factor": 0.5,
                "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "eos_token_id": [ids["<|endoftext|>"], ids["<|user|>"]],
                "rope_scaling": {"rope_type": "default", "mrope_section": list(glm_mrope_section(head // 4))}}
        vision = dict(depth=depth, hidden_size=VISION["embed_dim"], num_heads=VISION["num_heads"],
                      out_hidden_size=TEXT["hidden_size"], intermediate_size=TEXT["intermediate_size"],
                      image_size=336, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
        config = transformers.Glm4vConfig(
            text_config=text, vision_config=vision, image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
            image_start_token_id=ids["<|begin_of_image|>"], image_end_token_id=ids["<|end_of_image|>"],
            video_start_token_id=ids["<|begin_of_video|>"], video_end_token_id=ids["<|end_of_video|>"],
            tie_word_embeddings=False)
        return transformers.Glm4vForConditionalGeneration(config).eval()
    if family == "qwen3_vl":  # Qwen3-VL-2B's proportions at the benchmark's sizes
        text = {**TEXT, "vocab_size": VOCAB, "head_dim": TEXT["hidden_size"] // TEXT["num_attention_heads"],
                "rope_theta": 5000000.0, "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
                "rope_scaling": {"rope_type": "default", "mrope_interleaved": True, "mrope_section": [12, 10, 10]}}
        vision = dict(depth=depth, hidden_size=VISION["embed_dim"], num_heads=VISION["num_heads"],
                      intermediate_size=4 * VISION["embed_dim"], out_hidden_size=TEXT["hidden_size"], patch_size=16,
                      num_position_embeddings=48 * 48, deepstack_visual_indexes=[1, 3, 5][:max(1, depth // 2)])
        config = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                                            video_token_id=ids["<|video_pad|>"],
                                            vision_start_token_id=ids["<|vision_start|>"],
                                            vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=True)
        return transformers.Qwen3VLForConditionalGeneration(config).eval()
    text = {**TEXT, "vocab_size": VOCAB, "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"]}
    config = transformers.Qwen2VLConfig(text_config=text, vision_config={**VISION, "depth": depth},
                                        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                                        vision_start_token_id=ids["<|vision_start|>"],
                                        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=True)
    return transformers.Qwen2VLForConditionalGeneration(config).eval()


def build_folders(root: Path, quick: bool, family: str = "qwen2_vl") -> tuple[Path, Path]:
    """(transformers checkpoint, converted transformers.js folder), built once under ``root``."""
    import torch
    import transformers

    from edge_runtime.vision_convert import convert_vlm_folder
    from edge_runtime.vlm_files import glm_preprocessor_config, qwen_preprocessor_config, write_vlm_text_files

    tag = "quick" if quick else "full"
    # "-fused-gqa-ltk": a folder cached by an earlier converter (portable attention, unfused decoder, no
    # logits_to_keep) is not reused
    name = family.replace("_", "")
    hf, onnx_folder = root / f"hf-{name}-{tag}", root / f"onnx-{name}-{tag}-fused-gqa-ltk"
    if not (hf / "done").is_file():
        shutil.rmtree(hf, ignore_errors=True)
        hf.mkdir(parents=True)
        ids = write_vlm_text_files(hf, family, VOCAB, 0)
        torch.manual_seed(0)
        model = _model(family, 2 if quick else VISION["depth"], ids)
        with torch.no_grad():  # larger than the 0.02 init, so greedy answers vary with the image
            for param_name, p in model.named_parameters():
                if p.ndim > 1 and "norm" not in param_name:
                    p.normal_(0, 0.05)
        model.save_pretrained(hf)
        most = PIXELS_PER_TOKEN[family] * max(BUDGETS.values())
        if family == "glm4v":
            processor = glm_preprocessor_config(2 * 56 * 56, most)
            eos = model.config.text_config.eos_token_id
        else:
            processor = qwen_preprocessor_config(family, 64 * 64 if family == "qwen3_vl" else 56 * 56, most,
                                                 patch=16 if family == "qwen3_vl" else 14)
            eos = [ids["<|im_end|>"]]
        (hf / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
        transformers.GenerationConfig(eos_token_id=eos, do_sample=False).save_pretrained(hf)
        (hf / "done").write_text("ok")
    if not (onnx_folder / "onnx" / "decoder_model_merged.onnx").is_file():
        shutil.rmtree(onnx_folder, ignore_errors=True)
        convert_vlm_folder(hf, onnx_folder)
    return hf, onnx_folder


def add_quantized_parts(folder: Path) -> None:
    """``convert --quantize``'s parts, written into a cached fp32 folder that lacks them."""
    from edge_runtime.vlm_quant import write_quantized_parts

    import onnx

    q8 = folder / "onnx" / "decoder_model_merged_quantized.onnx"
    if (folder / "onnx" / "decoder_model_merged_int8.onnx").is_file() and not any(
            n.op_type == "DynamicQuantizeLinear" for n in onnx.load(str(q8), load_external_data=False).graph.node):
        return  # written, and by a converter whose q8 decoder quantizes activations per token
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["transformers.js_config"]["use_external_data_format"].update(write_quantized_parts(folder))
    config_path.write_text(json.dumps(config, indent=2))


def parse_precision(text: str) -> dict[str, str]:
    """``decoder=q8,vision_encoder=q8`` -> a ``[vision] precision`` table."""
    pairs = [item.split("=", 1) for item in text.split(",") if item]
    if not pairs or any(len(pair) != 2 for pair in pairs):
        raise SystemExit(f"--precision {text!r}: expected PART=NAME[,PART=NAME...], like decoder=q8,vision_encoder=q8")
    return {part.strip(): name.strip() for part, name in pairs}


def screenshot(step: int) -> Any:
    """A 1080x2400 screenshot, different at every step (list rows shift, colours change)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(step)
    image = Image.new("RGB", (1080, 2400), tuple(int(v) for v in rng.integers(200, 256, 3)))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, 1080, 90), fill=(30, 30, 30))
    for row in range(12):
        top = 140 + row * 170 + 10 * step
        draw.rectangle((40, top, 1040, top + 140), fill=(255, 255, 255), outline=(200, 200, 200), width=3)
        draw.ellipse((70, top + 30, 150, top + 110), fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        draw.text((190, top + 55), f"Item {row + 12 * step}", fill=(20, 20, 20))
    return image


def system_prompt(words: int = 550) -> str:
    rng = np.random.default_rng(1)
    vocab = ("tap swipe type back home screen button element coordinates action when the user asks you must "
             "answer with one function call do finish launch app long press wait scroll list text field").split()
    return "You are a phone agent. " + " ".join(rng.choice(vocab, words))


def messages(step: int, system: str, shots: list[Any], keep: int = 1) -> list[dict[str, Any]]:
    """Step ``step``'s request: ``shots[i]`` is user turn ``i``'s screenshot (``step + 1`` of them); the
    last ``keep`` user turns carry theirs, earlier turns are text only (agents strip old screenshots)."""
    turns: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for turn in range(step + 1):
        text = STEP_TEXT[turn]
        content: Any = ([{"type": "image", "image": shots[turn]}, {"type": "text", "text": text}]
                        if turn > step - keep else text)
        turns.append({"role": "user", "content": content})
        if turn < step:
            turns.append({"role": "assistant", "content": ANSWER})
    return turns


def image_count(turns: list[dict[str, Any]]) -> int:
    return sum(isinstance(t["content"], list) and sum(p["type"] == "image" for p in t["content"]) for t in turns)


def step_floor(model: Any, edge: dict[str, float], images: int, image_flops: int, gflops: dict[str, float],
               transformers_ms: float) -> dict[str, float]:
    """The fp32 floor (``tools/vlm_floor.py``) of what edge-runtime's step had to compute: the screenshots
    its feature cache did not hold, the prompt tokens its prefix cache did not; against transformers' TTFT."""
    encoded = images - int(edge["images_cached"])
    new, past = int(edge["prompt_tokens"] - edge["cached_tokens"]), int(edge["cached_tokens"])
    vision, text = encoded * image_flops, text_prefill_flops(model, new, past)
    ms = floor_ms(vision + text, gflops)
    return {"ms": round(ms, 1), "vision_gflop": round(vision / 1e9, 1), "text_gflop": round(text / 1e9, 1),
            "ratio_to_transformers": round(ms / transformers_ms, 3)}


class Transformers:
    """The transformers side: slow image processor, chat template, generate (the oracle's setup)."""

    def __init__(self, hf: Path, max_pixels: int, family: str = "qwen2_vl") -> None:
        import transformers

        self.placeholder = PLACEHOLDER[family]
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(hf)
        if family == "glm4v":
            self.model = transformers.Glm4vForConditionalGeneration.from_pretrained(hf, torch_dtype="float32").eval()
            processor = transformers.Glm4vImageProcessor.from_pretrained(hf)
            self.images = transformers.Glm4vImageProcessor.from_pretrained(
                hf, size={**processor.size, "longest_edge": max_pixels})
        else:
            model_class = (transformers.Qwen3VLForConditionalGeneration if family == "qwen3_vl"
                           else transformers.Qwen2VLForConditionalGeneration)
            self.model = model_class.from_pretrained(hf, torch_dtype="float32").eval()
            self.images = transformers.Qwen2VLImageProcessor.from_pretrained(hf, max_pixels=max_pixels)

    def step(self, turns: list[dict[str, Any]], new_tokens: int) -> dict[str, float]:
        import torch

        started = time.perf_counter()
        images = [p["image"] for t in turns if isinstance(t["content"], list) for p in t["content"]
                  if p["type"] == "image"]
        pixels = self.images(images=images, return_tensors="pt")
        shaped = [{**t, "content": [{"type": "image"} if p["type"] == "image" else p for p in t["content"]]}
                  if isinstance(t["content"], list) else t for t in turns]
        text = self.tokenizer.apply_chat_template(shaped, tokenize=False, add_generation_prompt=True)
        parts = text.split(self.placeholder)  # each image's pad repeated to its own token count
        counts = [int(grid.prod()) // 4 for grid in pixels["image_grid_thw"]]
        text = parts[0] + "".join(self.placeholder * n + part for n, part in zip(counts, parts[1:]))
        ids = self.tokenizer(text, return_tensors="pt", return_token_type_ids=False)
        prepared = time.perf_counter()
        inputs = dict(**ids, pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"])
        stamps = TokenTimes()
        with torch.inference_mode():
            self.model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                streamer=stamps)
        first, last = stamps.times[1], stamps.times[-1]  # times[0]: the prompt, handed over before any work
        return {"ttft_ms": (first - started) * 1e3, "preprocess_ms": (prepared - started) * 1e3,
                "model_ms": (first - prepared) * 1e3, "prompt_tokens": int(ids["input_ids"].shape[1]),
                "decode_tokens_per_s": (len(stamps.times) - 2) / max(last - first, 1e-9)}

    def vision_flops(self, image: Any) -> int:
        """FLOPs of transformers' vision tower on ``image`` at this side's budget."""
        pixels = self.images(images=[image], return_tensors="pt")
        return vision_flops(self.model, pixels["pixel_values"], pixels["image_grid_thw"])


class TokenTimes:
    """A ``generate`` streamer that only notes when each put (the prompt, then every new token) came."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        return None


def edge_model(folder: Path, threads: int, max_pixels: int, precision: dict[str, str], cache_dir: Path) -> Any:
    """A fresh edge-runtime model: its prefix cache starts empty in memory, as an episode's first step does;
    its blocks also go to disk under ``cache_dir`` (``prefix_cache_disk_bytes``), for the restart row."""
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.generation.vision.preprocess import VisionBudget
    from edge_runtime.generation.vision.settings import VisionSettings

    model = GenerativeModel("bench", folder, GenerationSettings(max_seq_len=8192, prefix_cache_bytes=256 << 20,
                                                                prefix_cache_disk_bytes=256 << 20),
                            threads=threads, vision=VisionSettings(precision=precision,
                                                                   budget=VisionBudget(max_pixels=max_pixels)),
                            cache_dir=cache_dir)
    model.generate(prompt="warm up", max_tokens=2)
    model.prompter.warm_up()
    return model


def edge_step(model: Any, turns: list[dict[str, Any]], new_tokens: int) -> dict[str, float]:
    reused = model.prompter.features.stats().hits
    result = model.generate(messages=turns, max_tokens=new_tokens, ignore_eos=True)
    t = result.timings
    decode_s = result.elapsed_s - (result.time_to_first_token_s or 0)
    return {"ttft_ms": t.first_token_ms, "image_decode_preprocess_ms": t.image_decode_ms + t.image_preprocess_ms,
            "vision_encode_ms": t.vision_encode_ms, "prefill_ms": t.prefill_ms,
            "first_token_ms": t.first_token_ms - t.prepare_ms - t.queue_ms - t.prefill_ms,
            "prompt_tokens": result.usage.prompt_tokens, "cached_tokens": result.usage.cached_tokens,
            "images_cached": model.prompter.features.stats().hits - reused,
            "decode_tokens_per_s": (new_tokens - 1) / max(decode_s, 1e-9)}


def best(rows: list[dict[str, float]]) -> dict[str, float]:
    """Per key the best of the rounds (least time, most tokens/s); counts (tokens, images) from the first round."""
    out = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        count = ("tokens" in key or key.startswith("images")) and not key.endswith("per_s")
        out[key] = max(values) if key.endswith("per_s") else values[0] if count else min(values)
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    hf, folder = build_folders(Path(args.models), args.quick, args.family)
    quantized = parse_precision(args.precision) if args.precision else None
    if quantized:
        add_quantized_parts(folder)
    system, steps = system_prompt(120 if args.quick else 550), 2 if args.quick else 5
    report: dict[str, Any] = {"family": args.family, "threads": args.threads, "new_tokens": args.new_tokens,
                              "keep_images": args.keep_images,
                              "quantized_precision": quantized, "budgets": {}}
    sides = {"edge_runtime": {}, **({"edge_runtime_quantized": quantized} if quantized else {})}
    peaks: list[dict[str, float]] = []
    for label, tokens in BUDGETS.items():
        max_pixels = tokens * PIXELS_PER_TOKEN[args.family]  # [vision] max_pixels means what the processor's does
        hf_side = Transformers(hf, max_pixels, args.family)
        peaks.append(gemm_peak_gflops(args.threads))  # the machine's fp32 GEMM rate, before and after the rounds
        # the episode's steps, the next episode's first step on the same (warm) models, then one more
        # episode's first step on models loaded anew (a restarted daemon: its prefix cache on disk)
        timings: dict[str, list[list[dict[str, float]]]] = {side: [[] for _ in range(steps + 2)]
                                                             for side in [*sides, "transformers"]}
        images_per_step = [0] * (steps + 2)
        for _ in range(args.rounds):
            disk = Path(tempfile.mkdtemp(prefix="bench-vlm-prefix-"))
            models = {side: edge_model(folder, args.threads, max_pixels, precision, disk / side)
                      for side, precision in sides.items()}
            try:
                for step in range(steps + 1):  # sides interleaved step by step
                    # the next episode's first step (step == steps): a new screenshot, no history
                    shots = [screenshot(s) for s in range(step + 1)] if step < steps else [screenshot(step)]
                    turns = messages(step % steps, system, shots, args.keep_images)
                    images_per_step[step] = image_count(turns)
                    for side, model in models.items():
                        timings[side][step].append(edge_step(model, turns, args.new_tokens))
                    timings["transformers"][step].append(hf_side.step(turns, args.new_tokens))
            finally:
                for model in models.values():
                    model.close()  # writes the blocks still pending to disk
            restarted = {side: edge_model(folder, args.threads, max_pixels, precision, disk / side)
                         for side, precision in sides.items()}
            try:
                turns = messages(0, system, [screenshot(steps + 1)], args.keep_images)
                images_per_step[steps + 1] = image_count(turns)
                for side, model in restarted.items():
                    timings[side][steps + 1].append(edge_step(model, turns, args.new_tokens))
                timings["transformers"][steps + 1].append(hf_side.step(turns, args.new_tokens))
            finally:
                for model in restarted.values():
                    model.close()
                shutil.rmtree(disk, ignore_errors=True)
        peaks.append(gemm_peak_gflops(args.threads))
        report["fp32_gemm_gflops"] = {engine: max(p[engine] for p in peaks) for engine in peaks[0]}
        image_flops = hf_side.vision_flops(screenshot(0))  # every screenshot is 1080x2400: one grid per budget
        rows = []
        for step in range(steps + 2):
            label_step: int | str = (step + 1 if step < steps else "1 (next episode)" if step == steps
                                     else "1 (after a restart)")
            row: dict[str, Any] = {"step": label_step, **{side: best(timings[side][step]) for side in timings}}
            for side in sides:
                key = "ttft_ratio" + side.removeprefix("edge_runtime")
                row[key] = round(row[side]["ttft_ms"] / row["transformers"]["ttft_ms"], 3)
            row["fp32_floor"] = step_floor(hf_side.model, row["edge_runtime"], images_per_step[step], image_flops,
                                           report["fp32_gemm_gflops"], row["transformers"]["ttft_ms"])
            rows.append(row)
        report["budgets"][label] = rows
        del hf_side
    return report


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = list(report["budgets"])
    fig, axes = plt.subplots(1, len(budgets), figsize=(6 * len(budgets), 6), squeeze=False)
    parts = [("image_decode_preprocess_ms", "image decode+preprocess"), ("vision_encode_ms", "vision encode"),
             ("prefill_ms", "prefill"), ("first_token_ms", "first token + rest")]
    quantized = "edge_runtime_quantized" in next(iter(report["budgets"].values()))[0]
    width, offset = (0.27, 0.27) if quantized else (0.4, 0.2)  # three bars per step, or two
    for ax, label in zip(axes[0], budgets):
        rows = report["budgets"][label]
        x = np.arange(len(rows))
        bottom = np.zeros(len(rows))
        for key, name in parts:
            values = np.array([max(r["edge_runtime"][key], 0.0) for r in rows])
            ax.bar(x - offset, values, width, bottom=bottom, label=f"edge-runtime fp32: {name}")
            bottom += values
        if quantized:
            ax.bar(x, [r["edge_runtime_quantized"]["ttft_ms"] for r in rows], width, color="tab:purple",
                   label=f"edge-runtime quantized ({report['quantized_precision']}): TTFT")
        ax.bar(x + offset, [r["transformers"]["ttft_ms"] for r in rows], width, color="grey",
               label="transformers fp32")
        ax.scatter(x - offset, [r["fp32_floor"]["ms"] for r in rows], marker="_", s=400, color="black", zorder=3,
                   label="fp32 floor: its FLOPs at peak GEMM")
        ax.scatter(x + offset, [r["transformers"]["ttft_ms"] / 2 for r in rows], marker="_", s=400, color="red",
                   zorder=3, label="goal: 0.5x transformers")
        ax.set_xticks(x, [f"step {r['step']}" if isinstance(r["step"], int) else
                          "next\nepisode" if "next" in r["step"] else "after a\nrestart" for r in rows], fontsize=8)
        ax.set_ylabel("time to first token (ms)")
        ax.set_title(f"~{label} image tokens per screenshot")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize=8)  # one legend, below: the bars stay clear
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(PIXELS_PER_TOKEN), default="qwen2_vl")
    parser.add_argument("--quick", action="store_true", help="vision depth 2, 2 steps, a short system prompt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--keep-images", type=int, default=1, metavar="N",
                        help="screenshots of the last N user turns stay in the history (default 1: the newest only)")
    parser.add_argument("--precision", default="", metavar="PART=NAME,...",
                        help="also run edge-runtime on these quantized parts (e.g. decoder=q8,vision_encoder=q8), "
                             "reported apart from the fp32 side; transformers stays fp32")
    parser.add_argument("--models", default=str(Path.home() / ".cache" / "edge-runtime" / "bench-vlm"))
    parser.add_argument("--out", default="bench-results/vlm")
    args = parser.parse_args(argv)
    if args.keep_images < 1:
        parser.error(f"--keep-images must be >= 1, got {args.keep_images}")
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_vlm.json").write_text(json.dumps(report, indent=2))
    plot(report, out / "bench_vlm.png")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
