"""Benchmark: text generation of edge-runtime against onnxruntime-genai, llama.cpp and a plain ORT loop.

Models (``--shape``): ``small``, a ~31M-parameter Qwen2-architecture decoder
(hidden 512, 8 layers, GQA 8/2 heads, intermediate 1408, vocab 16384), or
``0.5b``, Qwen2.5-0.5B's body (hidden 896, 24 layers, GQA 14/2, intermediate
4864) with a 16k vocabulary (~373M parameters); random weights, fp32, built with
``transformers`` (``hf_decoders``). The same checkpoint goes to every engine:

* edge-runtime (in-process, through its batcher, as an app gets it): our fused
  graph of the weights (``decoder_zoo.decoder_folder_from_hf``: GroupQueryAttention,
  KV appended in place) at fp32, and with ``--precisions fp32,int8,int4`` that
  folder quantized by ``edge_runtime.optimize.decoder_quant`` (what ``edge-runtime
  quantize FOLDER --mode int8|int4`` writes, the kernel chosen by measurement on this
  machine: MatMulNBits block 32 at the faster accuracy level, or for int8 the per-token
  MatMulInteger form; ``quantized_kernels`` in the JSON says which); at ``small`` also
  the optimum export served as exported (``fuse_exports`` off) and as a default load
  serves it (``edge-runtime-export-rebuilt``: rebuilt as the fused graph by
  ``generation.fused_exports``), our unfused graph and a plain ORT loop;
* onnxruntime-genai (``--genai-python``, default ``$EDGE_RUNTIME_GENAI_PYTHON`` or
  ``/work/venvs/genai/bin/python``): its model builder at fp32 (and int4 when
  ``int4`` is among the precisions), in ``tools/genai_worker.py``; and the same
  folders run by our engine (``edge-runtime-on-genai-folder``, what loading a genai
  text folder does by default), single stream and 1 / 8 streams;
* llama.cpp (``--llamacpp-python``, default ``$EDGE_RUNTIME_LLAMACPP_PYTHON``; off
  when unset): llama-cpp-python in ``tools/llamacpp_worker.py``, GGUF written by
  llama.cpp's ``convert_hf_to_gguf.py`` (f32) and quantized by its quantizer
  (q8_0, q4_0). Its venv: ``bash tools/llamacpp_venv.sh [/tmp/edge-runtime-llamacpp]``
  (``.ci/run`` runs it with ``EDGE_RUNTIME_CI_LLAMACPP=1``): llama-cpp-python 0.3.36
  built from its sdist with ``CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON
  -DGGML_F16C=ON -DGGML_AVX512=...`` (each x86 extension as /proc/cpuinfo lists it)
  ``-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"`` — with
  ``GGML_NATIVE`` on, a VM whose CPU lists AMX crashes in q4_0/q8_0 generation —
  plus torch 2.13.0 CPU, transformers 4.57.6, sentencepiece and the sdist's own gguf-py for the
  converter, the sdist unpacked under ``<venv>/src`` where the worker finds it.

Same intra-op threads everywhere. Measured:

* single stream, ``--context`` prompts (default 64 and 1,024 tokens), 128 new
  tokens (greedy, EOS ignored): time to first token and decode tokens/s
  ((N - 1) / time after the first token) of every side; ratios ours ÷ genai and
  ours ÷ llama.cpp at matching precision (fp32 <-> f32, int8 <-> q8_0, int4 <->
  q4_0) and how many greedy tokens agree (random weights: a near-tie flips a token
  and everything after it, so agreement is reported, not required);
* aggregate tokens/s of 1 and 8 concurrent streams (our continuous batching on the
  fused graph at each precision), genai's static batch of 8, llama.cpp's batched
  decoding of 8 sequences (one ``llama_batch`` per step); at ``small`` also 4
  streams on the optimum export;
* time to first token with a 1,000-token shared prefix: cached against uncached.

Rounds interleave every side (the order rotating; noise on a shared machine hits
all alike); each figure is the best of its rounds. Prints JSON, writes a PNG.

Usage: ``python tools/bench_generate.py [--quick] [--threads 2] [--shape small|0.5b]
[--precisions fp32,int8,int4] [--context 64,1024] [--llamacpp-python PATH] [--out DIR]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
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

from generate_peers import JsonWorker, PlainLoop, genai_worker, llamacpp_workers  # noqa: E402
from hf_decoders import DecoderSpec, hf_folder, optimum_folder  # noqa: E402

SHAPES = {
    "small": DecoderSpec(arch="qwen2", hidden=512, layers=8, heads=8, kv_heads=2, intermediate=1408, vocab=16384,
                         max_positions=2048, seed=0),
    # Qwen2.5-0.5B's body (its vocabulary is 152k; 16k keeps the tokenizer and the LM head small).
    "0.5b": DecoderSpec(arch="qwen2", hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=16384,
                        max_positions=2048, seed=0),
}
SPEC = SHAPES["small"]  # tools/bench_fused_decode.py measures the same model
GENAI_PYTHON = os.environ.get("EDGE_RUNTIME_GENAI_PYTHON", "/work/venvs/genai/bin/python")
LLAMACPP_PYTHON = os.environ.get("EDGE_RUNTIME_LLAMACPP_PYTHON")
# Our precision -> the peers' name for the same weight format (None: the peer has none measured).
PEERS = {"fp32": {"genai": "fp32", "llama.cpp": "f32"}, "int8": {"genai": None, "llama.cpp": "q8_0"},
         "int4": {"genai": "int4", "llama.cpp": "q4_0"}}


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


def side(engine: str, precision: str, context: int) -> str:
    """A single-stream side's name: engine, precision where not fp32/f32, context where not 64."""
    name = engine if precision in ("fp32", "f32") and engine != "llama.cpp" else f"{engine}-{precision}"
    return name if context == 64 else f"{name}-ctx{context}"


def agreement(ours: list[int], theirs: list[int]) -> dict[str, Any]:
    """How far two greedy token sequences agree: equal, first position that differs, share of equal positions."""
    same = [a == b for a, b in zip(ours, theirs)]
    first = next((i for i, s in enumerate(same) if not s), None)
    if first is None and len(ours) != len(theirs):
        first = min(len(ours), len(theirs))
    return {"equal": first is None, "first_difference": first,
            "same_position_share": round(sum(same) / max(len(ours), len(theirs), 1), 3)}


def precision_table(single: dict[str, Any], contexts: list[int], precisions: list[str]) -> dict[str, Any]:
    """Per context and precision: our decode tokens/s and ours ÷ each peer at the matching weight format."""
    table: dict[str, Any] = {}
    for context in contexts:
        for precision in precisions:
            ours = single.get(side("edge-runtime-fused", precision, context))
            if ours is None:
                continue
            row: dict[str, Any] = {"ours_decode_tokens_per_s": ours["decode_tokens_per_s_best"],
                                   "ours_ttft_ms": ours["ttft_ms_best"]}
            for engine, theirs in PEERS[precision].items():
                peer = single.get(side("onnxruntime-genai" if engine == "genai" else engine, theirs, context)) \
                    if theirs else None
                if peer is not None:
                    row[f"{engine}_{theirs}_decode_tokens_per_s"] = peer["decode_tokens_per_s_best"]
                    row[f"{engine}_{theirs}_ttft_ms"] = peer["ttft_ms_best"]
                    row[f"ours_vs_{engine}"] = round(ours["decode_tokens_per_s_best"]
                                                     / peer["decode_tokens_per_s_best"], 2)
            table[f"ctx{context}-{precision}"] = row
    return table


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
    parser.add_argument("--new-tokens", type=int, default=None, help="new tokens per request (default 128, quick 32)")
    parser.add_argument("--single-only", action="store_true",
                        help="only the interleaved single-stream rounds (no streams, no prefix cache): more rounds "
                             "in the same time on a noisy machine")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small",
                        help="small: the ~31M model (default); 0.5b: Qwen2.5-0.5B's body, ~373M parameters (only "
                             "the fused graph of ours: no optimum export, unfused graph or plain loop)")
    parser.add_argument("--precisions", default="fp32",
                        help="ours among fp32,int8,int4 (comma-separated; default fp32); int4 adds genai int4")
    parser.add_argument("--context", default="64,1024", help="prompt lengths, comma-separated (default 64,1024)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "generate")
    parser.add_argument("--models", type=Path, default=Path.home() / ".cache" / "edge-runtime" / "bench-models")
    parser.add_argument("--genai-python", default=GENAI_PYTHON)
    parser.add_argument("--llamacpp-python", default=LLAMACPP_PYTHON,
                        help="python of the llama-cpp-python venv (default $EDGE_RUNTIME_LLAMACPP_PYTHON; "
                             "without it llama.cpp is not measured)")
    args = parser.parse_args()
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    contexts = sorted({int(c) for c in args.context.split(",") if c.strip()})
    if not precisions or any(p not in PEERS for p in precisions) or "fp32" not in precisions:
        parser.error(f"--precisions: a comma-separated subset of {', '.join(PEERS)} that includes fp32")
    if not contexts or 64 not in contexts or any(c < 1 or c > 1900 for c in contexts):
        parser.error("--context: prompt lengths from 1 to 1900 that include 64")
    rounds = args.rounds or (2 if args.quick else 5)
    new = args.new_tokens or (32 if args.quick else 128)
    spec, small = SHAPES[args.shape], args.shape == "small"
    prefix_tokens, trials = 1000, (2 if args.quick else 4)

    from edge_runtime.decoder_zoo import decoder_folder_from_hf
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.optimize.decoder_quant import QUANTIZATION_FILE, quantize_decoder

    args.models.mkdir(parents=True, exist_ok=True)
    hf = hf_folder(spec, args.models)
    settings = GenerationSettings(max_batch_size=8, threads=args.threads, max_seq_len=2048,
                                  prefix_cache_bytes=512 * 1024 * 1024, prefill_chunk_tokens=512)
    fused_folder = args.models / f"fused-{spec.key}"
    if not (fused_folder / "model.onnx").is_file():
        decoder_folder_from_hf(hf, fused_folder, fused=True)
    ours: dict[str, Any] = {"fp32": GenerativeModel("bench-fused", fused_folder, settings)}
    kernels: dict[str, Any] = {}  # per quantized precision: the kernel quantize chose here, and its timings
    for precision in [p for p in precisions if p != "fp32"]:
        quantized = args.models / f"fused-{precision}-{spec.key}"
        record = quantized / QUANTIZATION_FILE
        if not (quantized / "model.onnx").is_file() or not record.is_file() \
                or "kernel" not in json.loads(record.read_text()):
            shutil.rmtree(quantized, ignore_errors=True)  # none yet, or written before the kernel choice
            quantize_decoder(fused_folder, quantized, precision, threads=args.threads)
        kernels[precision] = {k: v for k, v in json.loads(record.read_text()).items()
                              if k in ("kernel", "accuracy_level", "kernel_choice", "step_ms", "int8")}
        ours[precision] = GenerativeModel(f"bench-fused-{precision}", quantized, settings)
    fused = ours["fp32"]
    model = lean = plain = rebuilt = None
    if small:  # the unfused sides: the optimum export (911 nodes), our plain-ONNX graph, a hand loop
        folder = optimum_folder(spec, args.models)
        lean_folder = args.models / f"lean-{spec.key}"
        if not (lean_folder / "model.onnx").is_file():
            decoder_folder_from_hf(hf, lean_folder, fused=False)
        # the export served as exported, and as a load serves it by default: rebuilt as the fused graph
        model = GenerativeModel("bench", folder, dataclasses.replace(settings, fuse_exports=False))
        rebuilt = GenerativeModel("bench-export-rebuilt", folder, settings)
        lean = GenerativeModel("bench-lean", lean_folder, settings)
        kv = model.folder.kv
        plain = PlainLoop(folder / "model.onnx", args.threads, kv.layers, kv.kv_heads, kv.head_dim)
    notes: list[str] = []
    genai: dict[str, JsonWorker] = {}
    genai_folders: dict[str, Path] = {}
    if Path(args.genai_python).is_file():
        for precision in [p for p in precisions if PEERS[p]["genai"]]:
            name = "genai" if precision == "fp32" else f"genai-{precision}"  # fp32 keeps its older cache name
            genai_folders[precision] = args.models / f"{name}-{spec.key}"
            genai[precision] = genai_worker(args.genai_python, hf, genai_folders[precision], args.threads, precision)
    else:
        notes.append(f"onnxruntime-genai not measured: no interpreter at {args.genai_python}")
    # The same genai folders run in our engine (a genai text folder's default: continuous batching,
    # prefix cache, KV in place), beside onnxruntime-genai running them.
    on_genai: dict[str, Any] = {p: GenerativeModel(f"bench-genai-folder-{p}", folder, settings)
                                for p, folder in genai_folders.items()}
    llamacpp: dict[str, JsonWorker] = {}
    if args.llamacpp_python and Path(args.llamacpp_python).is_file():
        workers = llamacpp_workers(args.llamacpp_python, hf, args.models / f"gguf-{spec.key}", args.threads,
                                   max(contexts) + new + 16)
        llamacpp = {p: workers[PEERS[p]["llama.cpp"]] for p in precisions}
        for unused in set(workers.values()) - set(llamacpp.values()):
            unused.close()
    else:
        notes.append(f"llama.cpp not measured: no --llamacpp-python / $EDGE_RUNTIME_LLAMACPP_PYTHON interpreter "
                     f"({args.llamacpp_python!r})")
    rng = np.random.default_rng(0)

    def fresh_prompts(seed: int) -> tuple[dict[int, list[int]], dict[int, list[list[int]]]]:
        """A prompt of each context length, and 64-token prompts for 1, 4 and 8 streams (none shared), new
        every round: a prompt seen before would come from our prefix cache while the peers recompute it."""
        draw = np.random.default_rng(seed)
        singles = {c: [int(t) for t in draw.integers(10, spec.vocab, c)] for c in contexts}
        pool = [[int(t) for t in draw.integers(10, spec.vocab, 64)] for _ in range(13)]
        return singles, {1: pool[:1], 4: pool[1:5], 8: pool[5:]}

    # Each runner: (context, answer for a prompt of that length) -> one single-stream measurement.
    runners: dict[str, tuple[int, Any]] = {}
    for context in contexts:
        for precision, engine in ours.items():
            runners[side("edge-runtime-fused", precision, context)] = \
                (context, lambda t, e=engine: ours_single(e, t, new))
        for precision, worker in genai.items():
            runners[side("onnxruntime-genai", precision, context)] = \
                (context, lambda t, w=worker: w.ask(cmd="single", prompt=t, new=new))
        for precision, engine in on_genai.items():
            runners[side("edge-runtime-on-genai-folder", precision, context)] = \
                (context, lambda t, e=engine: ours_single(e, t, new))
        for precision, worker in llamacpp.items():
            runners[side("llama.cpp", PEERS[precision]["llama.cpp"], context)] = \
                (context, lambda t, w=worker: w.ask(cmd="single", prompt=t, new=new))
    if small:
        runners.update({"edge-runtime": (64, lambda t: ours_single(model, t, new)),
                        "edge-runtime-export-rebuilt": (64, lambda t: ours_single(rebuilt, t, new)),
                        "edge-runtime-own-graph": (64, lambda t: ours_single(lean, t, new)),
                        "plain-ort-loop": (64, lambda t: plain.run(t, new))})
        if 1024 in contexts:
            runners["edge-runtime-own-graph-ctx1024"] = (1024, lambda t: ours_single(lean, t, new))
            runners["edge-runtime-export-rebuilt-ctx1024"] = (1024, lambda t: ours_single(rebuilt, t, new))
    single: dict[str, list[dict[str, Any]]] = {name: [] for name in runners}
    streams: dict[int, list[float]] = {1: [], 4: [], 8: []}
    fused_streams = {precision: {1: [], 8: []} for precision in ours}
    on_genai_streams = {precision: {1: [], 8: []} for precision in on_genai}
    genai_batch8: list[float] = []
    llamacpp_batch8: dict[str, list[float]] = {PEERS[p]["llama.cpp"]: [] for p in llamacpp}
    warm = fresh_prompts(10_000)[0][64]
    for engine in [*ours.values(), *on_genai.values(), *([model, rebuilt, lean] if small else [])]:  # warm-up
        engine.generate(warm, max_tokens=4, ignore_eos=True)
    if plain is not None:
        plain.run(warm, 4)
    for worker in [*genai.values(), *llamacpp.values()]:
        worker.ask(cmd="single", prompt=warm, new=4)
    order = list(runners)
    started = time.perf_counter()
    for round_index in range(rounds):
        prompts, stream_prompts = fresh_prompts(round_index)  # every side gets the same prompts in a round
        for name in order[round_index % len(order):] + order[:round_index % len(order)]:  # rotate who goes first
            context, run = runners[name]
            single[name].append(run(prompts[context]))
        if args.single_only:
            continue
        if small:
            for count in streams:
                streams[count].append(ours_streams(model, stream_prompts[count], new))
        for precision, engine in ours.items():
            for count in fused_streams[precision]:
                fused_streams[precision][count].append(ours_streams(engine, stream_prompts[count], new))
        for precision, engine in on_genai.items():
            for count in on_genai_streams[precision]:
                on_genai_streams[precision][count].append(ours_streams(engine, stream_prompts[count], new))
        if "fp32" in genai:
            genai_batch8.append(genai["fp32"].ask(cmd="batch", prompts=stream_prompts[8], new=new)
                                ["aggregate_tokens_per_s"])
        for precision, worker in llamacpp.items():
            llamacpp_batch8[PEERS[precision]["llama.cpp"]].append(
                worker.ask(cmd="batch", prompts=stream_prompts[8], new=new)["aggregate_tokens_per_s"])
    rounds_s = time.perf_counter() - started
    # Shared 1,000-token prefix: uncached = a fresh prefix each time; cached = the same prefix again.
    cached_ms, uncached_ms = [], []
    prefixed = model if small else fused
    shared = [int(t) for t in rng.integers(10, spec.vocab, prefix_tokens)]
    if not args.single_only:
        prefixed.generate(shared + [11, 12, 13], max_tokens=1)  # fill the cache once
    for trial in range(0 if args.single_only else trials):
        fresh = [int(t) for t in rng.integers(10, spec.vocab, prefix_tokens)]
        suffix = [int(t) for t in rng.integers(10, spec.vocab, 16)]
        uncached_ms.append(prefixed.generate(fresh + suffix, max_tokens=1).time_to_first_token_s * 1e3)
        hit = prefixed.generate(shared + suffix, max_tokens=1)
        assert hit.usage.cached_tokens >= prefix_tokens - settings.prefix_block_tokens
        cached_ms.append(hit.time_to_first_token_s * 1e3)

    def tokens(name: str) -> list[int] | None:
        return single[name][0]["tokens"] if single.get(name) else None

    agree: dict[str, Any] = {}
    for context in contexts:
        for precision in ours:
            mine = tokens(side("edge-runtime-fused", precision, context))
            for engine, theirs in PEERS[precision].items():
                other = tokens(side("onnxruntime-genai" if engine == "genai" else engine, theirs, context)) \
                    if theirs else None
                if other is not None:
                    agree[f"ctx{context}-{precision}-vs-{engine}-{theirs}"] = agreement(mine, other)
            if precision == "fp32":
                continue
            # How far quantization moves each engine's own greedy tokens: on random weights the margins
            # are thin, so a quantized side leaving its fp32 early is the model, not a broken kernel.
            agree[f"ctx{context}-{precision}-vs-ours-fp32"] = agreement(
                mine, tokens(side("edge-runtime-fused", "fp32", context)))
            for engine, theirs in PEERS[precision].items():
                name = "onnxruntime-genai" if engine == "genai" else engine
                quantized = tokens(side(name, theirs, context)) if theirs else None
                full = tokens(side(name, PEERS["fp32"][engine], context))
                if quantized is not None and full is not None:
                    agree[f"ctx{context}-{engine}-{theirs}-vs-{engine}-{PEERS['fp32'][engine]}"] = \
                        agreement(quantized, full)
    for precision in on_genai:  # the same graph, two engines: the tokens should agree
        for context in contexts:
            agree[f"ctx{context}-{precision}-on-genai-folder-vs-genai"] = agreement(
                tokens(side("edge-runtime-on-genai-folder", precision, context)),
                tokens(side("onnxruntime-genai", precision, context)))
    if small:
        for name in ("edge-runtime", "edge-runtime-own-graph", "plain-ort-loop"):
            agree[f"ctx64-fp32-fused-vs-{name}"] = agreement(tokens("edge-runtime-fused"), tokens(name))
        if 1024 in contexts:
            agree["ctx1024-fp32-fused-vs-own-graph"] = agreement(tokens("edge-runtime-fused-ctx1024"),
                                                                 tokens("edge-runtime-own-graph-ctx1024"))
    summary: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "shape": args.shape, "model": {"params_millions": round(_params(spec) / 1e6, 1), **spec.__dict__},
        "threads": args.threads, "rounds": rounds, "contexts": contexts, "new_tokens": new,
        "precisions": precisions, "rounds_seconds": round(rounds_s, 1),
        "onnxruntime_genai": next(iter(genai.values())).version if genai else None,
        "llama_cpp_python": next(iter(llamacpp.values())).version if llamacpp else None,
        "notes": notes,
        "quantized_kernels": kernels,
        "greedy_token_agreement": agree,
        "single_stream": {name: {"ttft_ms_best": round(best([r["ttft_ms"] for r in rows], high=False), 2),
                                 "decode_tokens_per_s_best": round(best([r["decode_tokens_per_s"] for r in rows]), 1)}
                          for name, rows in single.items() if rows},
        "aggregate_tokens_per_s_best": {str(k): round(best(v), 1) for k, v in streams.items() if v},
        "aggregate_fused_tokens_per_s_best": {p: {str(k): round(best(v), 1) for k, v in counts.items() if v}
                                              for p, counts in fused_streams.items()},
        "genai_static_batch8_tokens_per_s_best": round(best(genai_batch8), 1) if genai_batch8 else None,
        "on_genai_folder_tokens_per_s_best": {p: {str(k): round(best(v), 1) for k, v in counts.items() if v}
                                              for p, counts in on_genai_streams.items()},
        "llamacpp_batch8_tokens_per_s_best": {p: round(best(v), 1) for p, v in llamacpp_batch8.items() if v},
        "prefix_ttft_ms_best": {"uncached": round(min(uncached_ms), 2), "cached": round(min(cached_ms), 2),
                                "prefix_tokens": prefix_tokens} if cached_ms else None,
    }
    s = summary["single_stream"]
    summary["by_precision"] = precision_table(s, contexts, precisions)
    fs = summary["aggregate_fused_tokens_per_s_best"]
    summary["ratios"] = {
        "decode_fused_vs_genai": _ratio(s, "onnxruntime-genai", "edge-runtime-fused"),
        "decode_fused_ctx1024_vs_ctx64": _ratio(s, "edge-runtime-fused", "edge-runtime-fused-ctx1024"),
        "fused_streams8_vs_streams1": {p: round(v["8"] / v["1"], 2) for p, v in fs.items() if "8" in v},
        # genai's own folders: our engine running them ÷ onnxruntime-genai running them, decode tokens/s
        "decode_on_genai_folder_vs_genai": {
            f"ctx{c}-{p}": _ratio(s, side("onnxruntime-genai", p, c), side("edge-runtime-on-genai-folder", p, c))
            for p in on_genai for c in contexts},
        "cached_ttft_vs_uncached": round(min(cached_ms) / min(uncached_ms), 3) if cached_ms else None,
    }
    if small:
        summary["ratios"].update({
            "decode_vs_genai": _ratio(s, "onnxruntime-genai"),
            "decode_own_graph_vs_genai": _ratio(s, "onnxruntime-genai", "edge-runtime-own-graph"),
            "decode_vs_plain_loop": _ratio(s, "plain-ort-loop"),
            "decode_fused_vs_own_graph": _ratio(s, "edge-runtime-own-graph", "edge-runtime-fused"),
            "decode_fused_vs_optimum": _ratio(s, "edge-runtime", "edge-runtime-fused"),
            # the export as a default load serves it (rebuilt as the fused graph) ÷ served as exported / ÷ genai
            "decode_export_rebuilt_vs_exported": _ratio(s, "edge-runtime", "edge-runtime-export-rebuilt"),
            "decode_export_rebuilt_vs_genai": _ratio(s, "onnxruntime-genai", "edge-runtime-export-rebuilt"),
            "decode_export_rebuilt_vs_genai_ctx1024": _ratio(s, "onnxruntime-genai-ctx1024",
                                                             "edge-runtime-export-rebuilt-ctx1024"),
            "decode_fused_vs_own_graph_ctx1024": _ratio(s, "edge-runtime-own-graph-ctx1024",
                                                        "edge-runtime-fused-ctx1024"),
            "streams8_vs_streams1": round(best(streams[8]) / best(streams[1]), 2) if streams[8] else None,
        })
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_generate.json").write_text(json.dumps(summary, indent=2))
    _plot(summary, args.out / "bench_generate.png")
    print(json.dumps(summary, indent=2))
    for engine in [*ours.values(), *on_genai.values(), *([model, rebuilt, lean] if small else [])]:
        engine.close()
    for worker in [*genai.values(), *llamacpp.values()]:
        worker.close()
    return 0


def _ratio(single: dict[str, Any], other: str, ours: str = "edge-runtime") -> float | None:
    if other not in single or ours not in single:
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

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    # Decode tokens/s per weight format and context, our fused graph beside each peer's matching format.
    table = summary["by_precision"]
    engines = (("ours", "tab:blue"), ("genai", "tab:orange"), ("llama.cpp", "tab:red"))
    width = 0.8 / len(engines)
    for index, (engine, colour) in enumerate(engines):
        # A row names each peer's rate by its format ("llama.cpp_q4_0_decode_tokens_per_s"); 0 where none ran.
        values = [next((v for k, v in row.items() if k.startswith(f"{engine}_")
                        and k.endswith("decode_tokens_per_s")), 0) for row in table.values()]
        axes[0].bar([i + index * width for i in range(len(table))], values, width, label=engine, color=colour)
    axes[0].set_xticks([i + 0.4 - width / 2 for i in range(len(table))], list(table))
    axes[0].set_title("single-stream decode tokens/s at matching precision")
    axes[0].legend(fontsize=8)
    streams = {f"ours {p} x{k}": v for p, counts in summary["aggregate_fused_tokens_per_s_best"].items()
               for k, v in counts.items()}
    if summary["genai_static_batch8_tokens_per_s_best"]:
        streams["genai fp32 batch 8"] = summary["genai_static_batch8_tokens_per_s_best"]
    streams.update({f"llama.cpp {p} x8": v for p, v in summary["llamacpp_batch8_tokens_per_s_best"].items()})
    axes[1].bar(list(streams), list(streams.values()), color="tab:green")
    axes[1].set_title("aggregate tokens/s, 1 and 8 streams")
    prefix = summary["prefix_ttft_ms_best"] or {"uncached": 0, "cached": 0, "prefix_tokens": 0}
    axes[2].bar(["uncached", "cached"], [prefix["uncached"], prefix["cached"]], color="tab:purple")
    axes[2].set_title(f"TTFT ms, {prefix['prefix_tokens']}-token shared prefix")
    for axis in axes:
        axis.tick_params(axis="x", labelrotation=30, labelsize=7)
    fig.suptitle(f"{summary['model']['params_millions']}M-param Qwen2-style decoder ({summary['shape']}), "
                 f"{summary['threads']} threads, best of {summary['rounds']} interleaved rounds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
