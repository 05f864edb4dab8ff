"""Benchmark: decode speed of int4/int8 weight-only decoders against the fp32 folder they came from.

Model: a ~63M-parameter Qwen2-architecture decoder with random weights (hidden
768, 6 layers, GQA 12/4 heads, MLP 2048, vocab 16384, fp32, about 250 MB),
built with ``decoder_zoo`` (no torch) and initialised at Hugging Face's scale
(std 0.02). ``edge_runtime.optimize.decoder_quant`` makes the int8 and int4
copies (onnxruntime's MatMulNBits quantizer, block 32) at accuracy level 4
(int8 compute) and, for int4, at level 0 (fp32 compute) too; and int8 as the
per-token ``MatMulInteger`` form (``per_token_int8``), the other kernel
``quantize --mode int8`` chooses between.

What a user has without this: the fp32 folder, served by the same engine. Each
round generates greedily (64-token prompt, ``--new-tokens`` new, EOS ignored)
once with every folder in turn, through edge-runtime's batcher; every figure is
the best of its rounds, so the machine's drift hits all alike. Reported: decode
tokens/s after the first token, time to first token, file size, and the
teacher-forced drift against fp32 on the default calibration text (KL, greedy
agreement, perplexity ratio; with random weights only the drift, not the
perplexity itself, means anything). Prints JSON, writes a PNG.

Usage: ``python tools/bench_decoder_quant.py [--rounds 5] [--new-tokens 64] [--threads 2] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge_runtime.decoder_zoo import DecoderShape, write_decoder_folder  # noqa: E402

SHAPE = DecoderShape(hidden=768, layers=6, heads=12, kv_heads=4, intermediate=2048, vocab=16384, max_positions=1024)
MODEL_VERSION = 1  # bump when SHAPE or the builder changes: the cached folders are rebuilt
# name -> (mode, quantize_decoder's kernel arguments): each kernel given, so every run compares the same forms
VARIANTS = {"int8": ("int8", {"accuracy_level": 4}), "int8-per-token": ("int8", {"kernel": "matmulinteger"}),
            "int4": ("int4", {"accuracy_level": 4}), "int4-fp32-compute": ("int4", {"accuracy_level": 0})}


def build(models: Path) -> dict[str, Path]:
    from edge_runtime.optimize.decoder_quant import quantize_decoder

    base = models / f"decoder-quant-v{MODEL_VERSION}"
    fp32 = base / "fp32"
    if not (fp32 / "model.onnx").is_file():
        shutil.rmtree(base, ignore_errors=True)
        write_decoder_folder(fp32, SHAPE, seed=0, std=0.02)
    folders = {"fp32": fp32}
    for name, (mode, kernel) in VARIANTS.items():
        folders[name] = base / name
        if not (folders[name] / "model.onnx").is_file():
            started = time.perf_counter()
            quantize_decoder(fp32, folders[name], mode, **kernel)
            print(f"quantized {name} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return folders


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--new-tokens", type=int, default=64, help="new tokens per generation (default 64)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "decoder-quant")
    parser.add_argument("--models", type=Path, default=Path.home() / ".cache" / "edge-runtime" / "bench-models")
    args = parser.parse_args()
    if args.rounds < 1 or args.new_tokens < 2 or args.threads < 1:
        parser.error("--rounds and --threads must be >= 1, --new-tokens >= 2")

    from edge_runtime.config import RuntimeConfig
    from edge_runtime.optimize.decoder_drift import DEFAULT_TEXT, decode_speed, decoder_drift, token_windows
    from edge_runtime.runtime import Runtime

    folders = build(args.models)
    prompt = token_windows(folders["fp32"], DEFAULT_TEXT, 64, 64)[0]
    runtime = Runtime(RuntimeConfig(intra_op_threads=args.threads, probe_opencl=False))
    try:
        best = decode_speed(runtime, list(folders.values()), prompt=prompt, new_tokens=args.new_tokens,
                            rounds=args.rounds, on_round=lambda r: print(f"round {r + 1}/{args.rounds}",
                                                                         file=sys.stderr))
    finally:
        runtime.close()
    speed = dict(zip(folders, best))
    fp32_rate, fp32_ttft = speed["fp32"]
    rows: dict[str, Any] = {}
    for name, folder in folders.items():
        rate, ttft = speed[name]
        size = sum(p.stat().st_size for p in folder.glob("model.onnx*"))
        row: dict[str, Any] = {"decode_tokens_per_s_best": round(rate, 1), "ttft_ms_best": round(ttft, 2),
                               "model_bytes": size, "decode_speedup_vs_fp32": round(rate / fp32_rate, 2),
                               "ttft_vs_fp32": round(ttft / fp32_ttft, 2)}
        if name != "fp32":
            drift = decoder_drift(folders["fp32"], folder, DEFAULT_TEXT, threads=args.threads).to_dict()
            row["drift"] = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in drift.items()}
        rows[name] = row
    summary = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
               "model": {"params_millions": round(_params(SHAPE) / 1e6, 1), **SHAPE.__dict__, "init_std": 0.02},
               "threads": args.threads, "rounds": args.rounds, "prompt_tokens": len(prompt),
               "new_tokens": args.new_tokens,
               "variants": {name: {"mode": mode, **kernel} for name, (mode, kernel) in VARIANTS.items()},
               "results": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_decoder_quant.json").write_text(json.dumps(summary, indent=2))
    _plot(summary, args.out / "bench_decoder_quant.png")
    print(json.dumps(summary, indent=2))
    return 0


def _params(shape: DecoderShape) -> int:
    kv = shape.kv_heads * shape.head_dim
    layer = shape.hidden * (2 * shape.hidden + 2 * kv) + 2 * kv + shape.hidden + 3 * shape.hidden * shape.intermediate
    return 2 * shape.vocab * shape.hidden + shape.layers * (layer + 2 * shape.hidden) + shape.hidden


def _plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["results"]
    names = list(rows)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    axes[0].bar(names, [rows[n]["decode_tokens_per_s_best"] for n in names], color="tab:blue")
    axes[0].set_title("decode tokens/s (best of rounds)")
    axes[1].bar(names, [rows[n]["model_bytes"] / 2**20 for n in names], color="tab:green")
    axes[1].set_title("model file MiB")
    quant = [n for n in names if "drift" in rows[n]]
    axes[2].bar(quant, [rows[n]["drift"]["kl_mean"] for n in quant], color="tab:orange")
    axes[2].set_title("mean KL vs fp32, nats/token")
    for axis in axes:
        axis.tick_params(axis="x", labelrotation=15)
    fig.suptitle(f"{summary['model']['params_millions']}M-param Qwen2-style decoder, weight-only quantization, "
                 f"{summary['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
