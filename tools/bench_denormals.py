"""Benchmark: a decoder with subnormal floats flushed to zero (the engine's default) against ONNX Runtime's default.

Same graph and weights (the ~31M-parameter Qwen2-style model of ``tools/bench_generate.py``, our
fused graph, random weights, fp32), two ``DecoderEngine``s: ``flushed`` (``flush_denormals=True``,
its steps run inside ``edge_runtime.denormals.flushed_denormals`` as the batcher's thread does) and
``ort_default`` (neither: what a plain ONNX Runtime loop gets). For each context: a prefill of that
many tokens, then decode steps; the sides alternate in blocks of ``--block`` steps (a 2-core machine
drifts between seconds, so both see the same drift), ``--rounds`` blocks each; figures are the
median and 10th-percentile step, and the best prefill. Also checks both pick the same greedy tokens.
Prints JSON, writes ``bench_denormals.json`` and ``bench_denormals.png`` to ``--out``.

Usage: ``python tools/bench_denormals.py [--threads 2] [--contexts 64 1024] [--rounds 4] [--out DIR]``
"""

from __future__ import annotations

import argparse
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
from bench_report import publish  # noqa: E402
from hf_decoders import hf_folder  # noqa: E402

SIDES = {"flushed": True, "ort_default": False}


def _case(engines: dict[str, Any], context: int, rounds: int, block: int, rng: np.random.Generator) -> dict[str, Any]:
    from edge_runtime.denormals import flushed_denormals

    prompt = [int(t) for t in rng.integers(10, SPEC.vocab, context)]
    last, tokens, prefill_ms = {}, {}, {}
    times: dict[str, list[float]] = {name: [] for name in engines}
    for name, engine in engines.items():
        with flushed_denormals(SIDES[name]):
            started = time.perf_counter()
            logits, past = engine.prefill(prompt, None)
            prefill_ms[name] = (time.perf_counter() - started) * 1e3
        engine.kv.rebuild([], [past])
        last[name] = int(logits.argmax())
        tokens[name] = [last[name]]
    for _ in range(rounds):
        for name, engine in engines.items():
            with flushed_denormals(SIDES[name]):
                for _ in range(block):
                    started = time.perf_counter()
                    logits = engine.decode([last[name]])
                    times[name].append(time.perf_counter() - started)
                    last[name] = int(logits[0].argmax())
                    tokens[name].append(last[name])
    for engine in engines.values():
        engine.kv.rebuild([], [])
    row: dict[str, Any] = {"context": context, "steps": rounds * block,
                           "same_greedy_tokens": tokens["flushed"] == tokens["ort_default"]}
    for name, values in times.items():
        ms = np.asarray(values) * 1e3
        row[name] = {"median_ms": round(float(np.median(ms)), 3), "p10_ms": round(float(np.percentile(ms, 10)), 3),
                     "prefill_ms": round(prefill_ms[name], 1)}
    row["decode_speedup_median"] = round(row["ort_default"]["median_ms"] / row["flushed"]["median_ms"], 2)
    row["decode_speedup_p10"] = round(row["ort_default"]["p10_ms"] / row["flushed"]["p10_ms"], 2)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contexts", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--rounds", type=int, default=4, help="blocks of steps per side and context")
    parser.add_argument("--block", type=int, default=40, help="decode steps per block")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "denormals")
    parser.add_argument("--models", type=Path, default=Path.home() / ".cache" / "edge-runtime" / "bench-models")
    args = parser.parse_args()

    from edge_runtime.decoder_zoo import decoder_folder_from_hf
    from edge_runtime.denormals import supported
    from edge_runtime.generation.engine import DecoderEngine
    from edge_runtime.generation.folder import read_folder

    if not supported():
        raise SystemExit("this platform cannot switch flush-to-zero (x86-64 Linux with glibc only)")
    args.models.mkdir(parents=True, exist_ok=True)
    folder = args.models / f"fused-{SPEC.key}"  # the folder bench_generate builds
    if not (folder / "model.onnx").is_file():
        decoder_folder_from_hf(hf_folder(SPEC, args.models), folder, fused=True)
    max_len = max(args.contexts) + args.rounds * args.block + 8
    engines = {name: DecoderEngine(read_folder(folder), threads=args.threads, max_batch=1, max_len=max_len,
                                   flush_denormals=flush) for name, flush in SIDES.items()}
    rng = np.random.default_rng(0)
    _case(engines, 16, 1, 4, rng)  # warm-up: first runs allocate and pre-pack
    rows = [_case(engines, context, args.rounds, args.block, rng) for context in args.contexts]
    summary = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "threads": args.threads,
               "model": {"hidden": SPEC.hidden, "layers": SPEC.layers, "heads": SPEC.heads,
                         "kv_heads": SPEC.kv_heads, "vocab": SPEC.vocab, "dtype": "fp32"}, "cases": rows}
    publish(summary, args.out, "bench_denormals", _plot)
    return 0


def _plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["cases"]
    fig, ax = plt.subplots(figsize=(6, 4))
    x = np.arange(len(rows))
    for offset, name in ((-0.2, "flushed"), (0.2, "ort_default")):
        ax.bar(x + offset, [r[name]["median_ms"] for r in rows], 0.4, label=name)
    ax.set_xticks(x, [f"context {r['context']}" for r in rows])
    ax.set_ylabel("decode step, median ms")
    ax.set_title("subnormals flushed vs ONNX Runtime's default")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
