"""``edge-runtime generate MODEL_DIR [--image PATH ...] (--prompt TEXT | --messages FILE.json) [--max-tokens N]
[--json]`` and the generation part of ``edge-runtime demo``.

``--image`` (repeatable; a vision-language folder) adds local image files: with ``--prompt``
as ``images=``, with ``--messages`` as image parts in front of the last user message's content.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from edge_runtime.errors import InvalidInputError

DEMO_DECODER_VERSION = 2  # bump when decoder_zoo's graph or the demo shape changes (2: the fused graph)


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="model folder (optimum export: model.onnx, config.json, tokenizer; "
                        "or a vision-language model in the transformers.js layout)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="plain prompt text")
    source.add_argument("--messages", type=Path, metavar="FILE.json",
                        help="chat messages: a JSON list of {role, content}, rendered by the chat template")
    parser.add_argument("--image", action="append", default=[], type=Path, metavar="PATH",
                        help="an image file for a vision-language model (repeatable)")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens at most (default 128)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--mm-processor-kwargs", type=_json_object, default=None, metavar="JSON",
                        help="the images' budget, as vLLM's field: '{\"max_pixels\": 200704}' (Qwen, GLM) or "
                             "'{\"size\": {\"longest_edge\": 1024}}' (SmolVLM); within the model's [vision] budget")
    parser.add_argument("--json", action="store_true", help="print one JSON object (text, usage, timings)")


def _json_object(text: str) -> dict[str, Any]:
    """An ``argparse`` type: a JSON object (a usage error otherwise)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _messages(path: Path) -> list[dict[str, Any]]:
    try:
        messages = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"--messages {path}: not a readable JSON file ({exc})") from None
    return messages


def with_images(messages: Any, images: list[Path]) -> Any:
    """``messages`` with ``images`` as image parts at the start of the last user message."""
    if not images:
        return messages
    users = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"] \
        if isinstance(messages, list) else []
    if not users:
        raise InvalidInputError("--image needs a user message in --messages to attach the images to")
    last = dict(messages[users[-1]])
    content = last.get("content")
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
    last["content"] = [*({"type": "image", "image": path} for path in images), *parts]
    return [*messages[:users[-1]], last, *messages[users[-1] + 1:]]


def run_generate(args: argparse.Namespace) -> int:
    from edge_runtime.runtime import Runtime

    runtime = Runtime()
    model = runtime.load_generative(args.model)
    try:
        params = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
                  "seed": args.seed, "stop": args.stop or None}
        if args.mm_processor_kwargs is not None:
            params["mm_processor_kwargs"] = args.mm_processor_kwargs
        images = [path.expanduser() for path in args.image]
        if args.messages:
            kwargs: dict[str, Any] = {"messages": with_images(_messages(args.messages), images)}
        else:
            kwargs = {"prompt": args.prompt, **({"images": images} if images else {})}
        if args.json:
            result = model.generate(**kwargs, **params)
            report = {"text": result.text, "finish_reason": result.finish_reason, "usage": result.usage.to_dict(),
                      "token_ids": list(result.token_ids),
                      "time_to_first_token_ms": round((result.time_to_first_token_s or 0) * 1e3, 3),
                      "elapsed_ms": round(result.elapsed_s * 1e3, 3)}
            if result.timings is not None:
                report["timings_ms"] = result.timings.to_dict()
            print(json.dumps(report, ensure_ascii=False, indent=2))
        else:
            for chunk in model.iter_chunks(**kwargs, **params):
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
            sys.stdout.write("\n")
    finally:
        model.close()
        runtime.close()
    return 0


def demo_decoder_folder(cache_dir: Path) -> Path:
    """The demo decoder (random weights, local tokenizer), built without torch and cached."""
    import shutil

    from edge_runtime.decoder_zoo import DecoderShape, write_decoder_folder

    folder = Path(cache_dir) / "models" / f"demo-decoder-v{DEMO_DECODER_VERSION}"
    if not (folder / "model.onnx").is_file():
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        write_decoder_folder(tmp, DecoderShape(hidden=256, layers=4, heads=8, kv_heads=2, intermediate=512,
                                               vocab=4096, max_positions=1024), seed=0)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.replace(folder)
    return folder


def generation_demo(runtime: Any, new_tokens: int = 64) -> dict[str, Any]:
    """Generate with the demo decoder: one stream, then four at once; returns speeds and a sample."""
    from concurrent.futures import ThreadPoolExecutor

    model = runtime.load_generative(demo_decoder_folder(runtime.config.cache_dir), "demo-decoder")
    messages = [{"role": "system", "content": "You are a phone agent."},
                {"role": "user", "content": "open the settings menu and scroll down"}]
    try:
        model.generate(messages=messages, max_tokens=4, ignore_eos=True)  # warm-up
        one = model.generate(messages=messages, max_tokens=new_tokens, ignore_eos=True)
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda i: model.generate(prompt=f"step {i}: tap ok", max_tokens=new_tokens,
                                                             ignore_eos=True), range(4)))
        elapsed = max(r.elapsed_s for r in results)
        decode_s = one.elapsed_s - (one.time_to_first_token_s or 0)
        return {"model": "demo decoder (Qwen2-style, random weights, 4 layers, GQA 8/2)",
                "prompt_tokens": one.usage.prompt_tokens,
                "time_to_first_token_ms": round((one.time_to_first_token_s or 0) * 1e3, 2),
                "decode_tokens_per_s": round((new_tokens - 1) / decode_s, 1) if decode_s > 0 else None,
                "aggregate_tokens_per_s_4_streams": round(4 * new_tokens / elapsed, 1),
                "sample": one.text[:60]}
    finally:
        model.close()


def format_generation(row: dict[str, Any]) -> str:
    return (f"\nedge-runtime demo: text generation, {row['model']}\n"
            f"  prompt {row['prompt_tokens']} tokens, time to first token {row['time_to_first_token_ms']} ms, "
            f"decode {row['decode_tokens_per_s']} tokens/s (one stream), "
            f"{row['aggregate_tokens_per_s_4_streams']} tokens/s (4 streams)\n"
            f"  sample (random weights): {row['sample']!r}")
