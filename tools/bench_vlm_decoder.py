"""Benchmark: the VLM decoder as GroupQueryAttention (the converter's default) against the portable graph.

Same weights: ``bench_vlm``'s random Qwen2-VL checkpoint converted twice (default, and
``--portable-attention``: standard ops, KV cache concatenated). Each side is a
``GenerativeModel`` (prefix cache off) generating 32 greedy tokens after a ~2,900-token text prompt
(nothing else decoding: the idle batcher's 1,024-token prefill chunks); rounds alternate the sides,
each figure is the best of its rounds (least prefill ms, most decode tokens/s). Also checks the
tokens are equal. Further sides: ``gqa-chunk256`` (the same graph prefilled in 256-token chunks,
as before ``idle_prefill_chunk_tokens``), ``gqa-all-logits`` (the same graph with the engine not feeding
``logits_to_keep``: the LM head over every prefill position, as before it existed) and, with ``--quantized``, the ``convert --quantize``
decoders ``gqa-q8`` (dynamic int8), ``gqa-q4`` (MatMulNBits; weights differ, so their tokens may
differ from fp32's and are not compared); with ``--per-call``, the fp32 decoder through onnxruntime's
``quantize_dynamic`` as transformers.js writes a q8 file (one activation scale per call), served as
exported (``q8-per-call``, ``fuse_exports`` off) and as a default load serves it (``q8-per-token``:
``generation.per_token_exports``, the same integers with per-row scales).

Usage: ``python tools/bench_vlm_decoder.py [--threads 1] [--rounds 3] [--quantized] [--per-call]
[--out bench-results/vlm-decoder]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tools"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

import bench_vlm  # noqa: E402


def run(args: argparse.Namespace) -> dict[str, Any]:
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.vision_convert import convert_vlm_folder

    hf, fused = bench_vlm.build_folders(Path(args.models), quick=False)
    portable = Path(args.models) / "onnx-qwen2vl-full-portable-decoder-ltk"  # -ltk: with logits_to_keep
    if not (portable / "onnx" / "decoder_model_merged.onnx").is_file():
        convert_vlm_folder(hf, portable, fused=False)
    from edge_runtime.generation.vision.settings import VisionSettings

    settings = GenerationSettings(max_seq_len=4096, prefix_cache_bytes=0)
    sides = {"portable": (portable, settings, {}), "gqa": (fused, settings, {}),
             "gqa-chunk256": (fused, dataclasses.replace(settings, idle_prefill_chunk_tokens=0), {}),
             "gqa-all-logits": (fused, settings, {})}
    if args.quantized:
        bench_vlm.add_quantized_parts(fused)
        sides.update({f"gqa-{p}": (fused, settings, {"decoder": p}) for p in ("q8", "q4")})
    if args.per_call:
        per_call = _per_call_folder(fused, Path(args.models) / "onnx-qwen2vl-full-per-call-q8")
        sides.update({"q8-per-call": (per_call, dataclasses.replace(settings, fuse_exports=False), {"decoder": "q8"}),
                      "q8-per-token": (per_call, settings, {"decoder": "q8"})})
    models = {k: GenerativeModel(k, f, s, threads=args.threads, vision=VisionSettings(precision=precision))
              for k, (f, s, precision) in sides.items()}
    engine = models["gqa-all-logits"].engine
    engine.folder = dataclasses.replace(engine.folder, keeps_logits=False)
    turns = [{"role": "system", "content": bench_vlm.system_prompt(550) + bench_vlm.system_prompt(500)},
             {"role": "user", "content": bench_vlm.STEP_TEXT[0]}]
    best: dict[str, dict[str, float]] = {}
    tokens: dict[str, list[int]] = {}
    try:
        for round_ in range(args.rounds + 1):  # round 0 warms up
            for name, model in models.items():
                result = model.generate(messages=turns, max_tokens=32, ignore_eos=True)
                row = {"prefill_ms": result.timings.prefill_ms, "prompt_tokens": result.usage.prompt_tokens,
                       "decode_tokens_per_s": 31 / max(result.elapsed_s - result.time_to_first_token_s, 1e-9)}
                tokens[name] = list(result.token_ids)
                if round_:
                    old = best.setdefault(name, row)
                    best[name] = {**row, "prefill_ms": min(old["prefill_ms"], row["prefill_ms"]),
                                  "decode_tokens_per_s": max(old["decode_tokens_per_s"], row["decode_tokens_per_s"])}
    finally:
        for model in models.values():
            model.close()
    return {"threads": args.threads, "rounds": args.rounds,
            "best": {k: {a: round(b, 2) for a, b in v.items()} for k, v in best.items()},
            "prefill_speedup": round(best["portable"]["prefill_ms"] / best["gqa"]["prefill_ms"], 3),
            "decode_speedup": round(best["gqa"]["decode_tokens_per_s"] / best["portable"]["decode_tokens_per_s"], 3),
            "idle_chunk_prefill_speedup": round(best["gqa-chunk256"]["prefill_ms"] / best["gqa"]["prefill_ms"], 3),
            "last_logits_prefill_speedup": round(best["gqa-all-logits"]["prefill_ms"] / best["gqa"]["prefill_ms"], 3),
            "same_tokens": tokens["gqa"] == tokens["portable"] == tokens["gqa-chunk256"] == tokens["gqa-all-logits"]}


def _per_call_folder(fused: Path, out: Path) -> Path:
    """``fused`` with its q8 decoder replaced by the fp32 one through ``quantize_dynamic`` (cached in ``out``)."""
    import shutil

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target = out / "onnx" / "decoder_model_merged_quantized.onnx"
    if not target.is_file():
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(fused, out, ignore=shutil.ignore_patterns("decoder_model_merged_*"))
        quantize_dynamic(out / "onnx" / "decoder_model_merged.onnx", target, weight_type=QuantType.QInt8,
                         extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT})
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["best"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in zip(axes, ("prefill_ms", "decode_tokens_per_s"), ("prefill (ms)", "decode (tokens/s)")):
        ax.bar(names, [report["best"][n][key] for n in names], color=["grey", *["tab:blue"] * (len(names) - 1)])
        ax.tick_params(axis="x", labelrotation=30)
        ax.set_ylabel(label)
    fig.suptitle(f"VLM decoder, {report['threads']} thread(s), best of {report['rounds']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quantized", action="store_true", help="also the q8 and q4 decoders of convert --quantize")
    parser.add_argument("--per-call", action="store_true",
                        help="also a quantize_dynamic q8 decoder, as exported and served per token")
    parser.add_argument("--models", default=str(Path.home() / ".cache" / "edge-runtime" / "bench-vlm"))
    parser.add_argument("--out", default="bench-results/vlm-decoder")
    args = parser.parse_args(argv)
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_vlm_decoder.json").write_text(json.dumps(report, indent=2))
    plot(report, out / "bench_vlm_decoder.png")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
