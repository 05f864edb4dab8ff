"""Benchmark: decode tokens/s with a JSON-schema constraint against unconstrained decoding.

Models: the ~31M-parameter Qwen2-style decoder of ``bench_generate.py`` (hidden
512, 8 layers, vocab 16,384, random weights, exported by ``optimum``) and the
same body with a 151,936-token vocabulary (Qwen2.5's size; the tokenizer's
merges come from a small corpus, the rest of its vocabulary is filler tokens).
Both go through ``GenerativeModel`` (batcher, sampler, llguidance masks) as an
app gets it.

Each measurement: 64-token prompts, ``new`` tokens, greedy, EOS ignored; the
schema (an object whose ``steps`` array needs more items than ``new`` tokens
can write) keeps the constrained answer going to ``max_tokens`` too, so both
sides decode the same number of tokens. Single stream: decode tokens/s after
the first token; 8 streams: aggregate tokens/s of 8 concurrent requests
(continuous batching). Rounds interleave constrained and unconstrained (their
order alternating), each figure is the best of its rounds. Prints JSON, writes
a PNG. Goal (issue 25): constrained >= 0.9x unconstrained.

Usage: ``python tools/bench_structured.py [--quick] [--threads 2] [--out bench-results/structured]``
"""

from __future__ import annotations

import argparse
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

from bench_report import publish  # noqa: E402
from hf_decoders import DecoderSpec, optimum_folder  # noqa: E402

BODY = dict(arch="qwen2", hidden=512, layers=8, heads=8, kv_heads=2, intermediate=1408, seed=0)
SPECS = {"vocab16k": DecoderSpec(vocab=16384, max_positions=2048, **BODY),
         "vocab152k": DecoderSpec(vocab=151936, max_positions=1024, **BODY)}
SCHEMA = {"type": "object", "properties": {"steps": {
    "type": "array", "minItems": 400, "items": {
        "type": "object", "properties": {
            "action": {"enum": ["tap", "swipe", "type", "back", "home"]},
            "x": {"type": "integer", "minimum": 0, "maximum": 1080},
            "y": {"type": "integer", "minimum": 0, "maximum": 2400},
            "text": {"type": "string", "maxLength": 12}},
        "required": ["action", "x", "y"], "additionalProperties": False}}},
    "required": ["steps"], "additionalProperties": False}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "plan", "schema": SCHEMA}}


def single(model: Any, prompt: list[int], new: int, constrained: bool) -> float:
    extra = {"structured_outputs": {"json": SCHEMA}} if constrained else {}
    result = model.generate(prompt, max_tokens=new, ignore_eos=True, **extra)
    assert len(result.token_ids) == new, (result.finish_reason, len(result.token_ids))
    first = result.time_to_first_token_s or 0.0
    return (new - 1) / (result.elapsed_s - first)


def streams(model: Any, prompts: list[list[int]], new: int, constrained: bool) -> float:
    extra = {"structured_outputs": {"json": SCHEMA}} if constrained else {}
    started = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: model.generate(p, max_tokens=new, ignore_eos=True, **extra), prompts))
    assert all(len(r.token_ids) == new for r in results)
    return sum(len(r.token_ids) for r in results) / (time.perf_counter() - started)


def mask_costs(model: Any, vocab: int, new: int) -> dict[str, float]:
    """Median microseconds per token of one row's mask: computing it (llguidance; off the critical path
    in the batcher, overlapped with the decode step) and applying it to the logits (on it)."""
    from edge_runtime.generation.constraints import GrammarSpec

    guide = model.grammars.guide(GrammarSpec.json_schema(SCHEMA, "bench"))
    rng = np.random.default_rng(1)
    fill, apply = [], []
    for _ in range(new):
        logits = rng.standard_normal(vocab).astype(np.float32)
        started = time.perf_counter()
        guide.compute_mask()
        computed = time.perf_counter()
        masked = guide.masked(logits)
        applied = time.perf_counter()
        guide.consume(int(np.argmax(masked)))
        fill.append((computed - started) * 1e6)
        apply.append((applied - computed) * 1e6)
    return {"compute_mask_us_median": round(float(np.median(fill)), 1),
            "apply_mask_us_median": round(float(np.median(apply)), 1)}


def measure(model: Any, vocab: int, rounds: int, new: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(10, min(vocab, 16384), 64)]
    prompts = [[int(t) for t in rng.integers(10, min(vocab, 16384), 64)] for _ in range(8)]
    runs: dict[str, list[float]] = {f"{kind}_{n}": [] for kind in ("free", "json") for n in (1, 8)}
    single(model, prompt, 8, True)  # warm-up: compiles the grammar (cached from here on)
    single(model, prompt, 8, False)
    for round_ in range(rounds):
        order = (False, True) if round_ % 2 == 0 else (True, False)
        for constrained in order:
            kind = "json" if constrained else "free"
            runs[f"{kind}_1"].append(single(model, prompt, new, constrained))
        for constrained in order:
            kind = "json" if constrained else "free"
            runs[f"{kind}_8"].append(streams(model, prompts, new, constrained))
    best = {k: round(max(v), 1) for k, v in runs.items()}
    return {"tokens_per_s_best": best, "rounds": {k: [round(x, 1) for x in v] for k, v in runs.items()},
            "ratio_1_stream": round(best["json_1"] / best["free_1"], 3),
            "ratio_8_streams": round(best["json_8"] / best["free_8"], 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds, 32 new tokens, 16k vocabulary only")
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads (default 2)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 4, quick 2)")
    parser.add_argument("--new", type=int, default=None, help="new tokens per request (default 96, quick 32)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "structured")
    parser.add_argument("--models", type=Path, default=Path.home() / ".cache" / "edge-runtime" / "bench-models")
    parser.add_argument("--only", choices=sorted(SPECS), default=None, help="one model only")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 4)
    new = args.new or (32 if args.quick else 96)
    names = [args.only] if args.only else (["vocab16k"] if args.quick else list(SPECS))

    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings

    args.models.mkdir(parents=True, exist_ok=True)
    settings = GenerationSettings(max_batch_size=8, threads=args.threads, max_seq_len=1024, prefix_cache_bytes=0)
    summary: dict[str, Any] = {"threads": args.threads, "new_tokens": new, "rounds": rounds, "models": {}}
    for name in names:
        spec = SPECS[name]
        model = GenerativeModel(name, optimum_folder(spec, args.models), settings)
        try:
            summary["models"][name] = {"vocab": spec.vocab, **measure(model, spec.vocab, rounds, new),
                                       **mask_costs(model, spec.vocab, new)}
        finally:
            model.close()
    publish(summary, args.out, "structured", _plot)
    return 0


def _plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = summary["models"]
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for axis, (name, result) in zip(axes[0], models.items()):
        best = result["tokens_per_s_best"]
        x = np.arange(2)
        axis.bar(x - 0.2, [best["free_1"], best["free_8"]], 0.4, label="unconstrained")
        axis.bar(x + 0.2, [best["json_1"], best["json_8"]], 0.4, label="json_schema")
        axis.set_xticks(x, ["1 stream (decode)", "8 streams (aggregate)"])
        axis.set_title(f"{name}: ratio {result['ratio_1_stream']} / {result['ratio_8_streams']}")
        axis.set_ylabel("tokens/s")
        axis.legend()
    fig.suptitle(f"constrained vs unconstrained decoding, {summary['threads']} threads, best of "
                 f"{summary['rounds']} interleaved rounds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
