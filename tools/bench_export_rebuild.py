"""Benchmark: an optimum export served as exported against its fused rebuild (``generation.fused_exports``).

The generation benchmark's ~31M Qwen2-style model (``bench_generate.SHAPES``; ``--shape 0.5b`` for
Qwen2.5-0.5B's body), exported by ``optimum`` as users get it from onnx-community, in four files:
fp32 ``model.onnx``, the int4 ``model_q4.onnx`` transformers.js' quantizer writes (onnxruntime's
``MatMulNBitsQuantizer``: block 32, symmetric, no accuracy level = 0), the same at accuracy level 4,
and its int8 ``model_quantized.onnx`` (onnxruntime's ``quantize_dynamic`` as transformers.js runs it
for a decoder: int8 weights per tensor, ``DynamicQuantizeLinear`` + ``MatMulInteger``, the embedding
as a uint8 Gather). Each file is loaded twice by the engine: ``fuse_exports`` off (the export's
graph: ~45 nodes a layer, two KV buffers swapped every step, every position's logits) and on (the
default: rebuilt as the fused graph with the file's own weights). The two loads of a file are the
alternative a user has and the one a default load gives.

Per file and context (``--context``, default 64 and 1,024 prompt tokens): single-stream decode
tokens/s and time to first token, 128 new greedy tokens (EOS ignored); aggregate tokens/s of 8
concurrent streams; how many leading greedy tokens of both loads agree (of 128: at accuracy level 4
activations are rounded to int8, so one fp32 rounding apart can flip a near-tie of random weights;
the q8 export rounds them per tensor, its rebuild per token), and, with ``fp32`` among the files,
how many of each quantized load's agree with the fp32 export's (``tokens_agree_fp32``).
Rounds interleave every side (the order rotating); each figure is the best of its rounds. Prints
JSON, writes a PNG.

Usage: ``python tools/bench_export_rebuild.py [--rounds 3] [--threads 2] [--shape small|0.5b]
[--files fp32,q4,q4-level4,q8] [--out DIR]``
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tools"):
    if str(_path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(_path))

from bench_generate import SHAPES, best, ours_single, ours_streams  # noqa: E402
from bench_report import publish  # noqa: E402
from hf_decoders import optimum_folder  # noqa: E402

# file -> (precision setting, accuracy level of its MatMulNBits or None for fp32 and q8)
FILES = {"fp32": ("fp32", None), "q4": ("q4", 0), "q4-level4": ("q4", 4), "q8": ("q8", None)}


def community_folder(export: Path, out: Path, names: list[str]) -> dict[str, Path]:
    """One onnx-community-layout folder per file of ``names`` (a folder's ``onnx/model_q4.onnx`` is one
    file, so the level-4 variant gets a folder of its own); cached under ``out``."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    folders = {}
    for name in names:
        precision, level = FILES[name]
        folder = out / f"community-{name}"
        files = {"fp32": "model.onnx", "q4": "model_q4.onnx", "q8": "model_quantized.onnx"}
        target = folder / "onnx" / files[precision]
        if not target.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            (folder / "onnx").mkdir(parents=True)
            for item in export.iterdir():
                if item.is_file() and not item.name.startswith("model.onnx"):
                    shutil.copy2(item, folder / item.name)
            if precision == "q8":  # transformers.js' q8 of a decoder: QInt8 weights, per tensor, full range
                quantize_dynamic(export / "model.onnx", target, weight_type=QuantType.QInt8,
                                 extra_options={"MatMulConstBOnly": True, "EnableSubgraph": True})
                folders[name] = folder
                continue
            proto = onnx.load(str(export / "model.onnx"))
            if level is not None:
                kwargs = {} if level == 0 else {"accuracy_level": level}  # transformers.js sets none
                quantizer = MatMulNBitsQuantizer(proto, bits=4, block_size=32, is_symmetric=True, **kwargs)
                quantizer.process()
                proto = quantizer.model.model
            onnx.save(proto, str(target), save_as_external_data=level is None, location="model.onnx_data")
        folders[name] = folder
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--context", default="64,1024")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--files", default=",".join(FILES), help=f"which of {', '.join(FILES)}")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "export-rebuild")
    parser.add_argument("--models", type=Path, default=Path.home() / ".cache" / "edge-runtime" / "bench-models")
    args = parser.parse_args()
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings

    spec, new = SHAPES[args.shape], args.new_tokens
    contexts = [int(c) for c in args.context.split(",")]
    names = [name for name in args.files.split(",") if name]
    if not names or set(names) - set(FILES):
        parser.error(f"--files: a comma-separated list of {', '.join(FILES)}")
    folders = community_folder(optimum_folder(spec, args.models), args.models / f"rebuild-{spec.key}", names)
    base = GenerationSettings(max_batch_size=8, threads=args.threads, max_seq_len=2048, prefix_cache_bytes=0,
                              prefill_chunk_tokens=512)
    models: dict[str, Any] = {}
    load_s: dict[str, float] = {}
    for name, folder in folders.items():
        for fused in (False, True):
            key = f"{name}-{'rebuilt' if fused else 'exported'}"
            started = time.perf_counter()  # a rebuilt side's first load includes the rebuild (then cached)
            models[key] = GenerativeModel(key, folder, dataclasses.replace(
                base, precision=FILES[name][0], fuse_exports=fused))
            load_s[key] = round(time.perf_counter() - started, 2)
    rng = np.random.default_rng(0)
    for model in models.values():  # warm-up
        model.generate([int(t) for t in rng.integers(10, spec.vocab, 64)], max_tokens=4, ignore_eos=True)
    single: dict[str, list[dict[str, Any]]] = {f"{k}-ctx{c}": [] for k in models for c in contexts}
    streams: dict[str, list[float]] = {k: [] for k in models}
    order = list(models)
    for round_index in range(args.rounds):
        prompts = {c: [int(t) for t in rng.integers(10, spec.vocab, c)] for c in contexts}
        eight = [[int(t) for t in rng.integers(10, spec.vocab, 64)] for _ in range(8)]
        for key in order[round_index % len(order):] + order[:round_index % len(order)]:
            for context in contexts:
                single[f"{key}-ctx{context}"].append(ours_single(models[key], prompts[context], new))
            streams[key].append(ours_streams(models[key], eight, new))
    result: dict[str, Any] = {"shape": args.shape, "model": spec.__dict__, "threads": args.threads,
                              "rounds": args.rounds, "new_tokens": new, "load_s": load_s,
                              "graph_nodes": {}, "sides": {}, "ratios": {}, "tokens_agree": {}}
    import onnx

    for key, model in models.items():
        result["graph_nodes"][key] = len(onnx.load(str(model.folder.model_path), load_external_data=False).graph.node)
    for side, runs in single.items():
        result["sides"][side] = {"decode_tokens_per_s_best": round(best([r["decode_tokens_per_s"] for r in runs]), 1),
                                 "ttft_ms_best": round(best([r["ttft_ms"] for r in runs], high=False), 1)}
    for key, values in streams.items():
        result["sides"][f"{key}-8streams"] = {"aggregate_tokens_per_s_best": round(best(values), 1)}
    for name in folders:
        for context in contexts:
            ours, theirs = single[f"{name}-rebuilt-ctx{context}"], single[f"{name}-exported-ctx{context}"]
            result["ratios"][f"{name}-ctx{context}-decode"] = round(
                result["sides"][f"{name}-rebuilt-ctx{context}"]["decode_tokens_per_s_best"]
                / result["sides"][f"{name}-exported-ctx{context}"]["decode_tokens_per_s_best"], 2)
            result["ratios"][f"{name}-ctx{context}-ttft"] = round(
                result["sides"][f"{name}-rebuilt-ctx{context}"]["ttft_ms_best"]
                / result["sides"][f"{name}-exported-ctx{context}"]["ttft_ms_best"], 2)
            a, b = ours[-1]["tokens"], theirs[-1]["tokens"]  # the last round's prompt, both loads
            result["tokens_agree"][f"{name}-ctx{context}"] = next(
                (i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            if "fp32" in folders and name != "fp32":
                reference = single[f"fp32-exported-ctx{context}"][-1]["tokens"]
                for load in ("exported", "rebuilt"):
                    tokens = single[f"{name}-{load}-ctx{context}"][-1]["tokens"]
                    result.setdefault("tokens_agree_fp32", {})[f"{name}-{load}-ctx{context}"] = next(
                        (i for i, (x, y) in enumerate(zip(tokens, reference)) if x != y), len(reference))
        result["ratios"][f"{name}-8streams"] = round(
            result["sides"][f"{name}-rebuilt-8streams"]["aggregate_tokens_per_s_best"]
            / result["sides"][f"{name}-exported-8streams"]["aggregate_tokens_per_s_best"], 2)
    for model in models.values():
        model.close()
    publish(result, args.out, "bench_export_rebuild", _plot)


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = result["ratios"]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(list(ratios), list(ratios.values()), color=["tab:blue" if "decode" in k or "streams" in k else "tab:orange"
                                                       for k in ratios])
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_ylabel("rebuilt ÷ exported (decode, 8 streams: higher is better; ttft: lower)")
    ax.set_title(f"optimum export rebuilt as the fused graph ({result['shape']}, {result['threads']} threads)")
    ax.tick_params(axis="x", rotation=60, labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
