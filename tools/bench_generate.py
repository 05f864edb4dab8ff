"""Benchmark: text generation of edge-runtime against onnxruntime-genai and a plain ONNX Runtime loop.

Model: a ~31M-parameter Qwen2-architecture decoder with random weights (hidden
512, 8 layers, GQA 8/2 heads, vocab 16384, fp32) built with ``transformers``
and exported by ``optimum`` for edge-runtime and the plain loop; the same
weights go through onnxruntime-genai's model builder (its own venv:
``--genai-python``, default ``$EDGE_RUNTIME_GENAI_PYTHON`` or
``/work/venvs/genai/bin/python``). Same intra-op threads everywhere.

* single stream, 64-token prompt, 128 new tokens (greedy, EOS ignored): time
  to first token and decode tokens/s of edge-runtime (through its batcher, as
  an app gets it) on the optimum export and on its own graph of the same
  weights (``decoder_zoo.decoder_folder_from_hf``: fused projections, no shape
  subgraphs), on our fused graph of them (``fused=True``: GroupQueryAttention,
  KV appended in place), onnxruntime-genai, and a hand-written ORT loop feeding
  ``present`` back as ``past`` through numpy; the same for our two graphs at a
  1,024-token context (where a per-token copy of the cache would show);
* aggregate tokens/s with 1, 4 and 8 concurrent streams (continuous batching),
  on the optimum export and on the fused graph, and genai's static batch of 8 beside it;
* time to first token with a 1,000-token shared prefix: cached (the prefix
  cache holds it) against uncached (a fresh prefix every time).

Rounds interleave the engines (noise on a shared machine hits all alike);
each figure is the best of its rounds. Prints JSON, writes a PNG.

Usage: ``python tools/bench_generate.py [--quick] [--threads 2] [--out bench-results/generate]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tools"):
    if str(_path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(_path))

from hf_decoders import DecoderSpec, hf_folder, optimum_folder  # noqa: E402

SPEC = DecoderSpec(arch="qwen2", hidden=512, layers=8, heads=8, kv_heads=2, intermediate=1408, vocab=16384,
                   max_positions=2048, seed=0)
GENAI_PYTHON = os.environ.get("EDGE_RUNTIME_GENAI_PYTHON", "/work/venvs/genai/bin/python")


class GenaiWorker:
    """tools/genai_worker.py in the genai venv, answering one JSON line per command."""

    def __init__(self, python: str, hf: Path, root: Path, threads: int) -> None:
        folder = root / f"genai-{SPEC.key}"
        worker = str(ROOT / "tools" / "genai_worker.py")
        if not (folder / "genai_config.json").is_file():
            subprocess.run([python, worker, "build", str(hf), str(folder)], check=True)
        self.process = subprocess.Popen([python, worker, "serve", str(folder), str(threads)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.version = self._read()["version"]

    def _read(self) -> dict[str, Any]:
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError("the genai worker exited")
        return json.loads(line)

    def ask(self, **command: Any) -> dict[str, Any]:
        self.process.stdin.write(json.dumps(command) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        return self._read()

    def close(self) -> None:
        self.process.stdin.close()  # type: ignore[union-attr]
        self.process.wait(timeout=30)


class PlainLoop:
    """What a user writes by hand: ORT session, present fed back as past through numpy."""

    def __init__(self, model_path: Path, threads: int, layers: int, kv_heads: int, head_dim: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        self.names = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
        self.empty = np.zeros((1, kv_heads, 0, head_dim), np.float32)

    def run(self, prompt: list[int], new: int) -> dict[str, Any]:
        started = time.perf_counter()
        n = len(prompt)
        feeds = {"input_ids": np.array([prompt], np.int64), "attention_mask": np.ones((1, n), np.int64),
                 "position_ids": np.arange(n, dtype=np.int64)[None], **{k: self.empty for k in self.names}}
        outputs = self.session.run(None, feeds)
        tokens = [int(np.argmax(outputs[0][0, -1]))]
        first = time.perf_counter()
        for _ in range(new - 1):
            length = n + len(tokens) - 1
            feeds = {"input_ids": np.array([[tokens[-1]]], np.int64),
                     "attention_mask": np.ones((1, length + 1), np.int64),
                     "position_ids": np.array([[length]], np.int64), **dict(zip(self.names, outputs[1:]))}
            outputs = self.session.run(None, feeds)
            tokens.append(int(np.argmax(outputs[0][0, -1])))
        end = time.perf_counter()
        return {"ttft_ms": (first - started) * 1e3, "decode_tokens_per_s": (new - 1) / (end - first),
                "tokens": tokens}


def ours_single(model: Any, prompt: list[int], new: int) -> dict[str, Any]:
    result = model.generate(prompt, max_tokens=new, ignore_eos=True)
    first = result.time_to_first_token_s or 0.0
    return {"ttft_ms": first * 1e3, "decode_tokens_per_s": (new - 1) / (result.elapsed_s - first),
            "tokens": list(result.token_ids)}


def ours_streams(model: Any, prompts: list[list[int]], new: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: model.generate(p, max_tokens=new, ignore_eos=True), prompts))
    return sum(len(r.token_ids) for r in results) / (time.perf_counter() - started)


def best(values: list[float], high: bool = True) -> float:
    return max(values) if high else min(values)


def main() -> int:
    if "--structured" in sys.argv[1:]:  # the constrained-decoding comparison lives in its own module
        import bench_structured

        sys.argv = [sys.argv[0], *(a for a in sys.argv[1:] if a != "--structured")]
        return bench_structured.main()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--structured", action="store_true",
                        help="run tools/bench_structured.py instead (json_schema-constrained vs free decode)")
    parser.add_argument("--quick", action="store_true", help="2 rounds, 32 new tokens (a smoke run)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads for every engine (default 2)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5, quick 2)")
    parser.add_argument("--single-only", action="store_true",
                        help="only the interleaved single-stream rounds (no streams, no prefix cache): more rounds "
                             "in the same time on a noisy machine")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "generate")
    parser.add_argument("--models", type=Path, default=Path.home() / ".cache" / "edge-runtime" / "bench-models")
    parser.add_argument("--genai-python", default=GENAI_PYTHON)
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 5)
    new = 32 if args.quick else 128
    prefix_tokens, trials = 1000, (2 if args.quick else 4)

    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings

    args.models.mkdir(parents=True, exist_ok=True)
    hf, folder = hf_folder(SPEC, args.models), optimum_folder(SPEC, args.models)
    settings = GenerationSettings(max_batch_size=8, threads=args.threads, max_seq_len=2048,
                                  prefix_cache_bytes=512 * 1024 * 1024, prefill_chunk_tokens=512)
    from edge_runtime.decoder_zoo import decoder_folder_from_hf

    lean_folder, fused_folder = args.models / f"lean-{SPEC.key}", args.models / f"fused-{SPEC.key}"
    if not (lean_folder / "model.onnx").is_file():
        decoder_folder_from_hf(hf, lean_folder)
    if not (fused_folder / "model.onnx").is_file():
        decoder_folder_from_hf(hf, fused_folder, fused=True)
    model = GenerativeModel("bench", folder, settings)
    lean = GenerativeModel("bench-lean", lean_folder, settings)
    fused = GenerativeModel("bench-fused", fused_folder, settings)
    kv = model.folder.kv
    plain = PlainLoop(folder / "model.onnx", args.threads, kv.layers, kv.kv_heads, kv.head_dim)
    genai = None
    genai_note = None
    if Path(args.genai_python).is_file():
        genai = GenaiWorker(args.genai_python, hf, args.models, args.threads)
    else:
        genai_note = f"onnxruntime-genai not measured: no interpreter at {args.genai_python}"
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(10, SPEC.vocab, 64)]
    stream_prompts = [[int(t) for t in rng.integers(10, SPEC.vocab, 64)] for _ in range(8)]
    long_prompt = [int(t) for t in rng.integers(10, SPEC.vocab, 1024)]
    single: dict[str, list[dict[str, Any]]] = {"edge-runtime": [], "edge-runtime-own-graph": [],
                                               "edge-runtime-fused": [], "plain-ort-loop": [], "onnxruntime-genai": [],
                                               "edge-runtime-own-graph-ctx1024": [], "edge-runtime-fused-ctx1024": []}
    streams: dict[int, list[float]] = {1: [], 4: [], 8: []}
    fused_streams: dict[int, list[float]] = {1: [], 8: []}
    genai_batch8: list[float] = []
    model.generate(prompt, max_tokens=4, ignore_eos=True)  # warm-up
    lean.generate(prompt, max_tokens=4, ignore_eos=True)
    fused.generate(prompt, max_tokens=4, ignore_eos=True)
    plain.run(prompt, 4)
    if genai is not None:
        genai.ask(cmd="single", prompt=prompt, new=4)
    runners = {"edge-runtime": lambda: ours_single(model, prompt, new),
               "edge-runtime-own-graph": lambda: ours_single(lean, prompt, new),
               "edge-runtime-fused": lambda: ours_single(fused, prompt, new),
               "plain-ort-loop": lambda: plain.run(prompt, new),
               "edge-runtime-own-graph-ctx1024": lambda: ours_single(lean, long_prompt, new),
               "edge-runtime-fused-ctx1024": lambda: ours_single(fused, long_prompt, new)}
    if genai is not None:
        runners["onnxruntime-genai"] = lambda: genai.ask(cmd="single", prompt=prompt, new=new)
    order = list(runners)
    for round_index in range(rounds):
        for name in order[round_index % len(order):] + order[:round_index % len(order)]:  # rotate who goes first
            single[name].append(runners[name]())
        if args.single_only:
            continue
        for count in streams:
            streams[count].append(ours_streams(model, stream_prompts[:count], new))
        for count in fused_streams:
            fused_streams[count].append(ours_streams(fused, stream_prompts[:count], new))
        if genai is not None:
            genai_batch8.append(genai.ask(cmd="batch", prompts=stream_prompts, new=new)["aggregate_tokens_per_s"])
    # Shared 1,000-token prefix: uncached = a fresh prefix each time; cached = the same prefix again.
    cached_ms, uncached_ms = [], []
    shared = [int(t) for t in rng.integers(10, SPEC.vocab, prefix_tokens)]
    if not args.single_only:
        model.generate(shared + [11, 12, 13], max_tokens=1)  # fill the cache once
    for trial in range(0 if args.single_only else trials):
        fresh = [int(t) for t in rng.integers(10, SPEC.vocab, prefix_tokens)]
        suffix = [int(t) for t in rng.integers(10, SPEC.vocab, 16)]
        uncached_ms.append(model.generate(fresh + suffix, max_tokens=1).time_to_first_token_s * 1e3)
        hit = model.generate(shared + suffix, max_tokens=1)
        assert hit.usage.cached_tokens >= prefix_tokens - settings.prefix_block_tokens
        cached_ms.append(hit.time_to_first_token_s * 1e3)
    agree = None
    if genai is not None:
        agree = single["onnxruntime-genai"][0]["tokens"] == single["edge-runtime"][0]["tokens"]
    summary: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": {"params_millions": round(_params(SPEC) / 1e6, 1), **SPEC.__dict__},
        "threads": args.threads, "rounds": rounds, "prompt_tokens": len(prompt), "new_tokens": new,
        "onnxruntime_genai": genai.version if genai is not None else genai_note,
        "greedy_tokens_agree_with_genai": agree,
        "greedy_tokens_agree_with_plain_loop": single["plain-ort-loop"][0]["tokens"] == single["edge-runtime"][0]["tokens"],
        "greedy_tokens_agree_own_graph": single["edge-runtime-own-graph"][0]["tokens"] == single["edge-runtime"][0]["tokens"],
        "greedy_tokens_agree_fused": single["edge-runtime-fused"][0]["tokens"] == single["edge-runtime"][0]["tokens"],
        "greedy_tokens_agree_fused_ctx1024": (single["edge-runtime-fused-ctx1024"][0]["tokens"]
                                              == single["edge-runtime-own-graph-ctx1024"][0]["tokens"]),
        "single_stream": {name: {"ttft_ms_best": round(best([r["ttft_ms"] for r in rows], high=False), 2),
                                 "decode_tokens_per_s_best": round(best([r["decode_tokens_per_s"] for r in rows]), 1)}
                          for name, rows in single.items() if rows},
        "aggregate_tokens_per_s_best": {str(k): round(best(v), 1) for k, v in streams.items() if v},
        "aggregate_fused_tokens_per_s_best": {str(k): round(best(v), 1) for k, v in fused_streams.items() if v},
        "genai_static_batch8_tokens_per_s_best": round(best(genai_batch8), 1) if genai_batch8 else None,
        "prefix_ttft_ms_best": {"uncached": round(min(uncached_ms), 2), "cached": round(min(cached_ms), 2),
                                "prefix_tokens": prefix_tokens} if cached_ms else None,
    }
    s = summary["single_stream"]
    summary["ratios"] = {
        "decode_vs_genai": _ratio(s, "onnxruntime-genai"),
        "decode_own_graph_vs_genai": _ratio(s, "onnxruntime-genai", "edge-runtime-own-graph"),
        "decode_vs_plain_loop": _ratio(s, "plain-ort-loop"),
        "decode_fused_vs_genai": _ratio(s, "onnxruntime-genai", "edge-runtime-fused"),
        "decode_fused_vs_own_graph": _ratio(s, "edge-runtime-own-graph", "edge-runtime-fused"),
        "decode_fused_vs_optimum": _ratio(s, "edge-runtime", "edge-runtime-fused"),
        "decode_fused_vs_own_graph_ctx1024": _ratio(s, "edge-runtime-own-graph-ctx1024", "edge-runtime-fused-ctx1024"),
        "decode_fused_ctx1024_vs_ctx64": _ratio(s, "edge-runtime-fused", "edge-runtime-fused-ctx1024"),
        "decode_own_graph_ctx1024_vs_ctx64": _ratio(s, "edge-runtime-own-graph", "edge-runtime-own-graph-ctx1024"),
        "fused_streams8_vs_streams1": round(best(fused_streams[8]) / best(fused_streams[1]), 2) if streams[8] else None,
        "streams8_vs_streams1": round(best(streams[8]) / best(streams[1]), 2) if streams[8] else None,
        "cached_ttft_vs_uncached": round(min(cached_ms) / min(uncached_ms), 3) if cached_ms else None,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_generate.json").write_text(json.dumps(summary, indent=2))
    _plot(summary, args.out / "bench_generate.png")
    print(json.dumps(summary, indent=2))
    model.close()
    lean.close()
    fused.close()
    if genai is not None:
        genai.close()
    return 0


def _ratio(single: dict[str, Any], other: str, ours: str = "edge-runtime") -> float | None:
    if other not in single:
        return None
    return round(single[ours]["decode_tokens_per_s_best"] / single[other]["decode_tokens_per_s_best"], 2)


def _params(spec: DecoderSpec) -> int:
    kv = spec.kv_heads * spec.hidden // spec.heads
    layer = spec.hidden * (2 * spec.hidden + 2 * kv) + 2 * kv + spec.hidden + 3 * spec.hidden * spec.intermediate
    return spec.vocab * spec.hidden + spec.layers * (layer + 2 * spec.hidden) + spec.hidden


def _plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    single = summary["single_stream"]
    axes[0].bar(list(single), [v["decode_tokens_per_s_best"] for v in single.values()], color="tab:blue")
    axes[0].set_title("single-stream decode tokens/s")
    streams = summary["aggregate_tokens_per_s_best"]
    labels = [f"{k} streams" for k in streams] + (["genai batch 8"] if summary["genai_static_batch8_tokens_per_s_best"]
                                                  else [])
    values = list(streams.values()) + ([summary["genai_static_batch8_tokens_per_s_best"]]
                                       if summary["genai_static_batch8_tokens_per_s_best"] else [])
    axes[1].bar(labels, values, color="tab:green")
    axes[1].set_title("aggregate tokens/s (edge-runtime continuous batching)")
    prefix = summary["prefix_ttft_ms_best"] or {"uncached": 0, "cached": 0, "prefix_tokens": 0}
    axes[2].bar(["uncached", "cached"], [prefix["uncached"], prefix["cached"]], color="tab:orange")
    axes[2].set_title(f"TTFT ms, {prefix['prefix_tokens']}-token shared prefix")
    for axis in axes:
        axis.tick_params(axis="x", labelrotation=15)
    fig.suptitle(f"{summary['model']['params_millions']}M-param Qwen2-style decoder, {summary['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
