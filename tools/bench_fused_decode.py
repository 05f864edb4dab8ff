"""Benchmark: one decode step of our fused graph (GroupQueryAttention, KV in place) against our unfused one.

Same weights (the ~31M-parameter Qwen2-style model of ``tools/bench_generate.py``,
random, fp32), both built by ``decoder_zoo.decoder_folder_from_hf`` (``fused=True`` /
``False``), each run by its own ``DecoderEngine`` exactly as the batcher runs it
(IO binding; in place for the fused graph, ping-pong buffers for the other). The
steps alternate one by one (fused, unfused, fused, ...), so a machine whose speed
drifts within a second (several jobs on two cores) slows both sides alike; the
figure per side is its median step and its 10th percentile ("best steady").

For each context (prompt length) and batch size: ``steps`` decode steps per
side after a prefill; reports ms per step, tokens/s and the fused/unfused ratio,
plus whether both picked the same greedy tokens. Prints JSON, writes a PNG.

Usage: ``python tools/bench_fused_decode.py [--threads 2] [--steps 200] [--out bench-results/fused-decode]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tools"):
    if str(_path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(_path))

from bench_generate import SPEC  # noqa: E402
from hf_decoders import hf_folder  # noqa: E402


def _engines(models: Path, threads: int, max_batch: int, max_len: int) -> dict[str, Any]:
    from edge_runtime.decoder_zoo import decoder_folder_from_hf
    from edge_runtime.generation.engine import DecoderEngine
    from edge_runtime.generation.folder import read_folder

    hf = hf_folder(SPEC, models)
    engines = {}
    for name, fused in (("fused", True), ("unfused", False)):
        folder = models / f"{'fused' if fused else 'lean'}-{SPEC.key}"  # the folders bench_generate builds
        if not (folder / "model.onnx").is_file():
            decoder_folder_from_hf(hf, folder, fused=fused)
        engines[name] = DecoderEngine(read_folder(folder), threads=threads, max_batch=max_batch, max_len=max_len)
    return engines


def _case(engines: dict[str, Any], context: int, batch: int, steps: int, rng: np.random.Generator) -> dict[str, Any]:
    prompts = [[int(t) for t in rng.integers(10, SPEC.vocab, context + 3 * row)] for row in range(batch)]
    tokens: dict[str, list[int]] = {}
    times: dict[str, list[float]] = {name: [] for name in engines}
    last: dict[str, list[int]] = {}
    for name, engine in engines.items():
        prefilled = [engine.prefill(p, None) for p in prompts]
        engine.kv.rebuild([], [past for _, past in prefilled])
        last[name] = [int(logits.argmax()) for logits, _ in prefilled]
        tokens[name] = [last[name][0]]
    for _ in range(steps):
        for name, engine in engines.items():  # one step each, alternating
            started = time.perf_counter()
            logits = engine.decode(last[name])
            times[name].append(time.perf_counter() - started)
            last[name] = [int(row.argmax()) for row in logits]
            tokens[name].append(last[name][0])
    for engine in engines.values():
        engine.kv.rebuild([], [])
    row: dict[str, Any] = {"context": context, "batch": batch, "steps": steps,
                           "same_greedy_tokens": tokens["fused"] == tokens["unfused"]}
    for name, values in times.items():
        ms = np.asarray(values) * 1e3
        row[name] = {"median_ms": round(float(np.median(ms)), 3), "p10_ms": round(float(np.percentile(ms, 10)), 3),
                     "tokens_per_s_median": round(batch * 1e3 / float(np.median(ms)), 1)}
    row["fused_vs_unfused_median"] = round(row["unfused"]["median_ms"] / row["fused"]["median_ms"], 2)
    row["fused_vs_unfused_p10"] = round(row["unfused"]["p10_ms"] / row["fused"]["p10_ms"], 2)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of both engines (default 2)")
    parser.add_argument("--steps", type=int, default=200, help="decode steps per side and case (default 200)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "fused-decode")
    parser.add_argument("--models", type=Path, default=Path.home() / ".cache" / "edge-runtime" / "bench-models")
    args = parser.parse_args()
    args.models.mkdir(parents=True, exist_ok=True)
    max_len = max(args.contexts) + 3 * max(args.batches) + args.steps + 8
    engines = _engines(args.models, args.threads, max(args.batches), max_len)
    rng = np.random.default_rng(0)
    _case(engines, 16, 1, 8, rng)  # warm-up: first runs allocate and pre-pack
    rows = [_case(engines, context, batch, args.steps, rng) for context in args.contexts for batch in args.batches]
    summary = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
               "model": {"hidden": SPEC.hidden, "layers": SPEC.layers, "heads": SPEC.heads, "kv_heads": SPEC.kv_heads,
                         "vocab": SPEC.vocab, "dtype": "fp32"},
               "threads": args.threads, "cases": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_fused_decode.json").write_text(json.dumps(summary, indent=2))
    _plot(rows, args.out / "bench_fused_decode.png")
    print(json.dumps(summary, indent=2))
    return 0


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"ctx {r['context']}, batch {r['batch']}" for r in rows]
    x = np.arange(len(rows))
    fig, axis = plt.subplots(figsize=(8, 4))
    for offset, name in ((-0.2, "unfused"), (0.2, "fused")):
        axis.bar(x + offset, [r[name]["tokens_per_s_median"] for r in rows], 0.4, label=name)
    axis.set_xticks(x, labels)
    axis.set_ylabel("decode tokens/s (median step)")
    axis.set_title("our graph: fused (GQA, KV in place) vs unfused, steps interleaved")
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
