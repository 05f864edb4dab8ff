"""``edge-runtime convert MODEL --to ncnn [--shape NAME=D,..]``: convert ahead of time.

``edge-runtime convert HF_FOLDER --to onnx --out DIR [--precision fp16] [--portable-attention] [--quantize]``
instead writes a vision-language checkpoint (transformers folder) as ONNX in the transformers.js
layout (``edge_runtime.vision_convert``).

Converts an ONNX model with pnnx into the cache (``$EDGE_RUNTIME_CACHE/ncnn/<key>/``)
and runs the correctness gate, exactly as the first load would; prints the
folder. Copy that folder into a device's cache (same path under its
``$EDGE_RUNTIME_CACHE``) to run the model there without pnnx.
Exit codes as every subcommand: 0, 1 (conversion failed or refused), 2 (usage).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TARGETS = ("ncnn", "ncnn_vulkan", "onnx")


def add_convert_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="ONNX model file (--to onnx: a transformers checkpoint folder)")
    parser.add_argument("--to", choices=TARGETS, default="ncnn",
                        help="target engine (default ncnn); onnx: a VLM checkpoint to the transformers.js layout, "
                             "a Qwen2/Qwen3/Llama text checkpoint to our fused decoder folder")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR", help="--to onnx: the folder to write")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=D1,D2,...",
                        help="input NAME's full shape, batch first (repeatable); dynamic dims default "
                             "to batch 1 and 64 otherwise")
    parser.add_argument("--precision", choices=("fp32", "fp16"), default=None,
                        help="weights and arithmetic (default: the runtime's, fp32); --to onnx: fp16 also "
                             "writes each part's _fp16 variant beside the fp32 one")
    parser.add_argument("--portable-attention", action="store_true",
                        help="--to onnx: write the vision encoder's and the decoder's attention in standard ONNX "
                             "ops (for plan gpu, whose OpenCL/Vulkan backends then take it, and for runtimes "
                             "without ONNX Runtime's contrib ops) instead of ONNX Runtime's fused "
                             "MultiHeadAttention / GroupQueryAttention, the fast forms on the CPU (default)")
    parser.add_argument("--quantize", action="store_true",
                        help="--to onnx (a VLM): also write onnx/vision_encoder_quantized.onnx and "
                             "onnx/decoder_model_merged_quantized.onnx (int8 MatMuls: q8) and "
                             "onnx/decoder_model_merged_{q4,int8}.onnx (weight-only MatMulNBits); pick them per "
                             "model with [vision] precision")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def parse_shapes(items: list[str]) -> dict[str, tuple[int, ...]]:
    """``["x=1,3,48,320"]`` -> ``{"x": (1, 3, 48, 320)}``; ValueError says which item is wrong."""
    shapes = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.replace("x", ",").split(","))
        except ValueError:
            raise ValueError(f"--shape {item!r}: expected NAME=D1,D2,... with integers, like x=1,3,48,320") from None
    return shapes


def run_vlm_convert(args: argparse.Namespace) -> int:
    from edge_runtime.errors import EdgeRuntimeError
    from edge_runtime.vision_convert import convert_vlm_folder

    if args.out is None:
        print("edge-runtime convert: --to onnx needs --out DIR (the folder to write)", file=sys.stderr)
        return 2
    if not args.model.is_dir():
        print(f"edge-runtime convert: {args.model} is not a folder; --to onnx expects a transformers checkpoint "
              "folder (config.json + model.safetensors)", file=sys.stderr)
        return 2
    if is_text_checkpoint(args.model):
        return run_text_convert(args)
    try:
        out = convert_vlm_folder(args.model, args.out, fp16=args.precision == "fp16",
                                 fused=not args.portable_attention, quantize=args.quantize)
    except (EdgeRuntimeError, ValueError) as exc:
        print(f"edge-runtime convert: {exc}", file=sys.stderr)
        return 1
    files = sorted(str(p.relative_to(out)) for p in (out / "onnx").iterdir())
    if args.json:
        print(json.dumps({"model": str(args.model), "to": "onnx", "folder": str(out), "files": files}, indent=2))
    else:
        print(f"{args.model} -> {out} ({', '.join(files)})")
    return 0


def is_text_checkpoint(folder: Path) -> bool:
    """A checkpoint folder whose ``config.json`` names a text decoder family our builder writes."""
    from edge_runtime.decoder_zoo import FAMILIES

    try:
        return json.loads((folder / "config.json").read_text()).get("model_type") in FAMILIES
    except (OSError, ValueError):
        return False  # the VLM path says what is wrong with the folder


def run_text_convert(args: argparse.Namespace) -> int:
    """``convert CHECKPOINT --to onnx --out DIR`` for a Qwen2/Qwen3/Llama text checkpoint: our fused
    decoder folder (``decoder_zoo.decoder_folder_from_hf``); quantize it with ``edge-runtime quantize``."""
    from edge_runtime.decoder_zoo import decoder_folder_from_hf
    from edge_runtime.errors import EdgeRuntimeError

    refused = [flag for flag, given in (("--quantize", args.quantize), ("--precision fp16", args.precision == "fp16"))
               if given]
    if refused:
        print(f"edge-runtime convert: {' and '.join(refused)} apply to vision-language checkpoints; a text "
              f"decoder is written in fp32 and quantized with `edge-runtime quantize {args.out} --mode int4|int8`",
              file=sys.stderr)
        return 2
    if args.out.resolve() == args.model.resolve():
        print(f"edge-runtime convert: --out {args.out} is the checkpoint folder itself; choose a new folder",
              file=sys.stderr)
        return 2
    try:
        out = decoder_folder_from_hf(args.model, args.out, fused=not args.portable_attention)
    except (EdgeRuntimeError, ValueError) as exc:
        print(f"edge-runtime convert: {exc}", file=sys.stderr)
        return 1
    files = sorted(p.name for p in out.iterdir())
    if args.json:
        print(json.dumps({"model": str(args.model), "to": "onnx", "folder": str(out), "files": files}, indent=2))
    else:
        print(f"{args.model} -> {out} ({', '.join(files)})")
    return 0


def run_convert(args: argparse.Namespace) -> int:
    import dataclasses

    if args.to == "onnx":
        return run_vlm_convert(args)
    from backends.onnx_graph import graph_inputs, load_onnx
    from edge_runtime.planning.cost import bound_input_shapes
    from edge_runtime.runtime import Runtime

    try:
        given = parse_shapes(args.shape)
    except ValueError as exc:
        print(f"edge-runtime convert: {exc}", file=sys.stderr)
        return 2
    proto = load_onnx(args.model)
    inputs = graph_inputs(proto)
    unknown = sorted(set(given) - {s.name for s in inputs})
    if unknown:
        print(f"edge-runtime convert: --shape names unknown input(s) {unknown}; inputs: "
              f"{[s.name for s in inputs]}", file=sys.stderr)
        return 2
    shapes = bound_input_shapes(inputs, given)
    runtime = Runtime()
    try:
        options = runtime.compile_options()
        if args.precision:
            options = dataclasses.replace(options, precision=args.precision)
        executable = runtime.backend(args.to).compile(proto, options)
        try:
            bucket = executable.prepare(tuple(tuple(shapes[s.name][1:]) for s in inputs))
            report = {"model": str(args.model), "to": args.to, "input_shapes": {k: list(v) for k, v in shapes.items()},
                      "folder": str(bucket.folder), "converted_now": bucket.converted_now,
                      "gate_worst_error": bucket.gate.worst, "gate_tolerance": bucket.gate.tolerance}
        finally:
            executable.close()
    finally:
        runtime.close()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        state = "converted" if report["converted_now"] else "already in the cache"
        print(f"{args.model} -> {args.to}: {state} at {report['folder']} "
              f"(gate: worst error {report['gate_worst_error']:.2g} <= {report['gate_tolerance']:g})")
    return 0
