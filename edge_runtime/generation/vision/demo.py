"""The vision part of ``edge-runtime demo``: one phone-agent step (a screenshot and a question) on a tiny VLM.

The model is a Qwen2-VL-shaped folder with random weights built locally
(``vlm_zoo``: no torch, no download) and cached; the screenshot is drawn
with Pillow at a phone's 1080×2400. The image budget keeps it at about 256
image tokens, as ``[vision] max_pixels`` would on a device.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

DEMO_VLM_VERSION = 1  # bump when vlm_zoo's graphs or the demo shape change
DEMO_MAX_PIXELS = 256 * 28 * 28  # ~256 image tokens (Qwen2-VL: one token per 28x28 pixels)


def demo_vlm_folder(cache_dir: Path) -> Path:
    """The demo VLM (random weights, local tokenizer), built without torch and cached."""
    from edge_runtime.vlm_zoo import write_vlm_folder

    folder = Path(cache_dir) / "models" / f"demo-vlm-v{DEMO_VLM_VERSION}"
    if not (folder / "onnx" / "decoder_model_merged.onnx").is_file():
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        write_vlm_folder(tmp, "qwen2_vl", seed=0)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.replace(folder)
    return folder


def demo_screenshot() -> Any:
    """A 1080x2400 RGB 'screenshot': a status bar, list rows and a button, drawn with Pillow."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (1080, 2400), (245, 245, 245))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, 1080, 90), fill=(30, 30, 30))
    for row in range(12):
        top = 160 + row * 170
        draw.rectangle((40, top, 1040, top + 140), fill=(255, 255, 255), outline=(210, 210, 210), width=3)
        draw.ellipse((70, top + 30, 150, top + 110), fill=(60 + 15 * row, 120, 200 - 10 * row))
        draw.text((190, top + 55), f"Setting {row + 1}", fill=(20, 20, 20))
    draw.rounded_rectangle((340, 2220, 740, 2340), radius=40, fill=(25, 118, 210))
    return image


def vlm_demo(runtime: Any, new_tokens: int = 32) -> dict[str, Any]:
    """One screenshot-to-text step (after a warm-up step), with its time breakdown."""
    from edge_runtime.generation.vision.preprocess import VisionBudget
    from edge_runtime.generation.vision.settings import VisionSettings

    vision = VisionSettings(budget=VisionBudget(max_pixels=DEMO_MAX_PIXELS))
    model = runtime.load_generative(demo_vlm_folder(runtime.config.cache_dir), "demo-vlm", vision=vision)
    from PIL import Image

    def step_messages(screenshot: Any) -> list[dict[str, Any]]:
        return [{"role": "system", "content": "You are a phone agent. Answer with the next action."},
                {"role": "user", "content": [{"type": "image", "image": screenshot},
                                             {"type": "text", "text": "Open the third setting."}]}]

    screenshot = demo_screenshot()
    try:
        model.generate(messages=step_messages(screenshot), max_tokens=2)  # warm-up: first-run costs aside
        fresh = screenshot.transpose(Image.Transpose.FLIP_LEFT_RIGHT)  # a new screenshot: no cached image KV
        step = model.generate(messages=step_messages(fresh), max_tokens=new_tokens, ignore_eos=True)
        image = model.prepare(messages=step_messages(fresh)).image_timings
        decode_s = step.elapsed_s - (step.time_to_first_token_s or 0)
        return {"model": "demo VLM (Qwen2-VL-style, random weights)", "screenshot": "1080x2400",
                "prompt_tokens": step.usage.prompt_tokens, "image_tokens": image.image_tokens if image else 0,
                "cached_tokens": step.usage.cached_tokens,
                "timings_ms": step.timings.to_dict() if step.timings else {},
                "decode_tokens_per_s": round((new_tokens - 1) / decode_s, 1) if decode_s > 0 else None,
                "sample": step.text[:60]}
    finally:
        model.close()


def format_vlm_demo(row: dict[str, Any]) -> str:
    t = row["timings_ms"]
    return (f"\nedge-runtime demo: one phone-agent step, {row['model']}\n"
            f"  {row['screenshot']} screenshot -> {row['image_tokens']} image tokens; prompt "
            f"{row['prompt_tokens']} tokens ({row['cached_tokens']} from the prefix cache)\n"
            f"  time to first token {t.get('first_token_ms')} ms = image decode {t.get('image_decode_ms')} + "
            f"preprocess {t.get('image_preprocess_ms')} + vision encode {t.get('vision_encode_ms')} + queue "
            f"{t.get('queue_ms')} + prefill {t.get('prefill_ms')} ms (+ template/tokenizer)\n"
            f"  decode {row['decode_tokens_per_s']} tokens/s; sample (random weights): {row['sample']!r}")
