"""The ``quantize`` and ``profile`` subcommands: arguments, and thin layers over the library.

``register(sub)`` adds both to the ``edge-runtime`` parser. Only argparse is
imported at module level, so building the parser stays cheap.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PLAN_CHOICES = ("cpu", "gpu", "hybrid", "auto")


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    quantize = sub.add_parser("quantize", help="int8 (dynamic / static QDQ) or fp16 copy of an ONNX model, or an "
                                               "int4/int8 weight-only copy of a decoder LLM folder, with its "
                                               "accuracy and speed against the original")
    quantize.add_argument("model", type=Path, help="fp32 ONNX model, or a decoder LLM folder (optimum layout)")
    quantize.add_argument("--mode", choices=("dynamic", "static", "fp16", "int4", "int8"), required=True,
                          help="a model file: dynamic int8, static int8 (QDQ, calibrated) or fp16; "
                               "a decoder folder: int4 or int8 weight-only (MatMulNBits)")
    quantize.add_argument("--out", type=Path, required=True, metavar="PATH",
                          help="write the converted model (a decoder: the converted folder) here")
    quantize.add_argument("--calibration", type=Path, metavar="DIR_OF_NPY|TEXT",
                          help="a model file: one .npy (single input) or .npz (per input) per sample, default 16 "
                               "seeded random samples; a decoder folder: a .txt file or folder of them, default a "
                               "built-in phone-agent text")
    quantize.add_argument("--block-size", type=int, default=None,
                          help="decoder: weights per quantization block (power of two, 16..256; default 32)")
    quantize.add_argument("--accuracy-level", type=_accuracy_level, default=None, metavar="auto|0..4",
                          help="decoder: MatMulNBits compute type, 0 = fp32, 4 = int8; auto (default): time "
                               "the candidates on this CPU and keep the faster")
    quantize.add_argument("--kernel", choices=("auto", "matmulnbits", "matmulinteger"), default="auto",
                          help="decoder: MatMulNBits, or (int8) MatMulInteger with activations quantized per "
                               "token; auto (default): int4 times MatMulNBits levels 0 and 4, int8 level 4 "
                               "against MatMulInteger, one and eight rows a step, and keeps the faster")
    quantize.add_argument("--float-embeddings", action="store_true",
                          help="decoder: keep the token-embedding table in float (default: stored in the "
                               "weights' bits and blocks, read by GatherBlockQuantized)")
    quantize.add_argument("--new-tokens", type=int, default=32, help="decoder: tokens per timed generation (32)")
    quantize.add_argument("--plan", choices=PLAN_CHOICES, action="append", default=None,
                          help="time on this plan (repeatable; default: every plan this device has)")
    quantize.add_argument("--rounds", type=int, default=5, help="timing rounds, best of each (default 5)")
    quantize.add_argument("--json", action="store_true", help="print the report as JSON")
    quantize.set_defaults(handler=run_quantize)

    profile = sub.add_parser("profile", help="per-node time of one run of a model, top costs first")
    profile.add_argument("model", type=Path, help="ONNX model")
    profile.add_argument("--plan", choices=PLAN_CHOICES, default="cpu", help="plan to profile (default cpu)")
    profile.add_argument("--repeat", type=int, default=10, help="profiled runs; times are averaged (default 10)")
    profile.add_argument("--top", type=int, default=20, help="rows to print (default 20; --json has all)")
    profile.add_argument("--json", action="store_true", help="print the profile as JSON")
    profile.set_defaults(handler=run_profile)


class _Progress:
    """A tqdm bar on stderr where tqdm is installed, else one line per tenth."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._total = 0
        self._done = 0

    def total(self, count: int) -> None:
        self._total = count
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=count, desc="calibrating", unit="sample", file=sys.stderr)

    def step(self) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.update(1)
        elif self._total and self._done % max(1, self._total // 10) == 0:
            print(f"calibrating: {self._done}/{self._total}", file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _accuracy_level(text: str) -> int | str:
    """``--accuracy-level``: ``auto`` or a MatMulNBits level 0..4."""
    if text == "auto":
        return text
    if text not in ("0", "1", "2", "3", "4"):
        raise argparse.ArgumentTypeError(f"must be auto or 0..4, got {text!r}")
    return int(text)


def run_quantize(args: argparse.Namespace) -> int:
    from edge_runtime.errors import InvalidInputError
    from edge_runtime.optimize.workflow import convert
    from edge_runtime.runtime import Runtime

    if args.rounds < 1:
        raise InvalidInputError(f"--rounds must be >= 1, got {args.rounds}")
    if args.model.is_dir():
        return _quantize_decoder(args)
    if not args.model.is_file():
        raise InvalidInputError(f"model file not found: {args.model}")
    if args.mode in ("int4", "int8"):
        raise InvalidInputError(f"--mode {args.mode} quantizes a decoder LLM folder's weights; for an ONNX model "
                                f"file use --mode dynamic, static or fp16 (got the file {args.model})")
    runtime = Runtime()
    progress = _Progress()
    try:
        report = convert(runtime, args.model, args.out, args.mode, calibration=args.calibration, plans=args.plan,
                         rounds=args.rounds, on_sample=progress.step, on_total=progress.total)
    finally:
        progress.close()
        runtime.close()
    data = report.to_dict()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"{args.mode}: wrote {data['out']} ({data['out_bytes']} bytes, {data['size_ratio']}x of fp32)")
    print(f"accuracy vs fp32 on {data['samples_from']} samples (plan cpu):")
    for drift in data["accuracy"]:
        top1 = "" if drift["top1_agreement"] is None else f", top-1 agreement {drift['top1_agreement']:.2%}"
        print(f"  {drift['name']}: max abs {drift['max_abs']:.3g}, mean abs {drift['mean_abs']:.3g}"
              f" ({drift['max_rel_range']:.2%} of range){top1}")
    print("speed (best of rounds, median ms):")
    for speed in data["speed"]:
        print(f"  {speed['plan']}: fp32 {speed['reference_ms']:.3f} ms, {args.mode} {speed['candidate_ms']:.3f} ms,"
              f" {speed['speedup']:.2f}x")
    for failed in data["plan_errors"]:
        print(f"  {failed['plan']}: cannot load the converted model: {failed['error']}")
    return 0


def _quantize_decoder(args: argparse.Namespace) -> int:
    from edge_runtime.optimize.decoder_quant import PRECISION_SLACK
    from edge_runtime.optimize.workflow import convert_decoder
    from edge_runtime.runtime import Runtime

    runtime = Runtime()
    try:
        report = convert_decoder(runtime, args.model, args.out, args.mode, calibration=args.calibration,
                                 block_size=args.block_size, accuracy_level=args.accuracy_level,
                                 kernel=args.kernel, embeddings=not args.float_embeddings,
                                 rounds=args.rounds, new_tokens=args.new_tokens)
    finally:
        runtime.close()
    data = report.to_dict()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    drift, speed = data["drift"], data["speed"]
    how = (f"MatMulNBits, block {data['block_size']}, accuracy level {data['accuracy_level']}"
           if data["kernel"] == "MatMulNBits" else "MatMulInteger, activations per token")
    print(f"{args.mode}: wrote {data['out']} ({data['out_bytes']} bytes, {data['size_ratio']}x of the original; "
          f"{data['matmuls_quantized']} of {data['matmuls_total']} MatMuls, {how}; embedding table "
          f"{'in ' + str(data['bits']) + ' bits' if data['embeddings_quantized'] else 'kept float'})")
    if data["step_ms"] is not None:
        timed = "; ".join(f"{name} " + ", ".join(f"{ms:.3f} ms at {rows} rows" for rows, ms in by_rows.items())
                          for name, by_rows in data["step_ms"].items())
        print(f"kernel chosen by measurement (median decode step here): {timed}")
        drifts = ", ".join(f"{name} {kl:.3g}" for name, kl in data["kl_mean"].items())
        print(f"  among those within {PRECISION_SLACK:g}x the smallest drift (mean KL nats/token): {drifts}")
    print(f"drift on {drift['tokens']} tokens of the {data['text_from']} text (teacher-forced):")
    print(f"  perplexity {drift['perplexity_reference']:.4g} -> {drift['perplexity_candidate']:.4g} "
          f"({drift['perplexity_ratio']:.4f}x), KL mean {drift['kl_mean']:.3g} max {drift['kl_max']:.3g} nats/token, "
          f"greedy agreement {drift['greedy_agreement']:.2%}, max |logit| diff {drift['max_abs_logit']:.3g}")
    print(f"decode speed (best of {speed['rounds']} rounds, {speed['new_tokens']} tokens): "
          f"original {speed['reference_tokens_per_s']:.1f} tokens/s, {args.mode} "
          f"{speed['candidate_tokens_per_s']:.1f} tokens/s, {speed['speedup']:.2f}x; time to first token "
          f"{speed['reference_ttft_ms']:.1f} -> {speed['candidate_ttft_ms']:.1f} ms")
    return 0


def run_profile(args: argparse.Namespace) -> int:
    from edge_runtime.errors import InvalidInputError
    from edge_runtime.optimize.profiler import format_profile, profile_model
    from edge_runtime.runtime import Runtime

    if args.repeat < 1 or args.top < 1:
        raise InvalidInputError("--repeat and --top must be >= 1")
    runtime = Runtime()
    try:
        profile = profile_model(runtime, args.model, args.plan, repeat=args.repeat)
    finally:
        runtime.close()
    if args.json:
        print(json.dumps(profile.to_dict(), indent=2))
    else:
        print(format_profile(profile, args.top))
    return 0
