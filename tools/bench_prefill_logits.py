"""Benchmark: a prefill that asks for its last position's logits (``logits_to_keep``) against the full LM head.

Our fused decoder graph with random weights at Qwen2.5-0.5B's shape by default (hidden 896, 24
layers, 14/2 heads, MLP 4864, its 151,936-token vocabulary: the head is ~27 % of a token's
arithmetic), run by the generation engine (``DecoderEngine.prefill``) on one ``--prompt``-token
chunk from an empty cache. Two sides on the same session, alternating run by run: ``last`` (what
the engine does: ``logits_to_keep`` = 1) and ``all`` (the folder described as one without the input,
so the head runs over every position, as before it existed and as for an optimum export). Each
side's figure is its best of ``--rounds``; both must give the same last-position logits.

The folder is built once under ``--models`` (~2.0 GB at the default shape; ~1 minute).
Prints JSON and writes ``bench_prefill_logits.json`` / ``.png`` to ``--out``.

    python tools/bench_prefill_logits.py [--prompt 1024] [--rounds 3] [--vocab 151936] [--out bench-results]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tools"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

from bench_report import publish  # noqa: E402


def build_folder(root: Path, shape: Any) -> Path:
    """``root/<shape>``: model.onnx (+ model.onnx.data) and config.json, random weights (seed 0, std 0.02)."""
    import onnx

    from edge_runtime.decoder_zoo import random_weights
    from edge_runtime.decoder_fused import build_fused_decoder

    folder = root / "h{hidden}-l{layers}-a{heads}-{kv_heads}-i{intermediate}-v{vocab}".format(**dataclasses.asdict(shape))
    if (folder / "done").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    model = build_fused_decoder(shape, random_weights(shape, 0, 0.02))
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    config = {"model_type": "qwen2", "vocab_size": shape.vocab, "max_position_embeddings": shape.max_positions,
              "eos_token_id": 0}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "done").write_text("")
    return folder


def run(args: argparse.Namespace) -> dict[str, Any]:
    from edge_runtime.decoder_zoo import DecoderShape
    from edge_runtime.generation.engine import DecoderEngine
    from edge_runtime.generation.folder import read_folder

    shape = DecoderShape(hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                         intermediate=args.intermediate, vocab=args.vocab, max_positions=args.prompt + 64)
    started = time.perf_counter()
    folder = build_folder(Path(args.models), shape)
    built_s = time.perf_counter() - started
    description = read_folder(folder)
    assert description.keeps_logits, f"{folder}: the graph has no logits_to_keep input"
    engine = DecoderEngine(description, threads=args.threads, max_batch=1, max_len=args.prompt + 16)
    described = {"last": description, "all": dataclasses.replace(description, keeps_logits=False)}
    tokens = [1 + (i * 7919) % (args.vocab - 1) for i in range(args.prompt)]
    times: dict[str, list[float]] = {side: [] for side in described}
    logits: dict[str, np.ndarray] = {}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for side, folder_description in described.items():
            engine.folder = folder_description
            begin = time.perf_counter()
            logits[side], _ = engine.prefill(tokens, None)
            if round_:
                times[side].append((time.perf_counter() - begin) * 1e3)
    best = {side: min(values) for side, values in times.items()}
    head_macs, body_macs = args.vocab * args.hidden, _body_macs_per_token(shape)
    return {
        "shape": dataclasses.asdict(shape), "prompt_tokens": args.prompt, "threads": args.threads,
        "rounds": args.rounds, "build_s": round(built_s, 1),
        "head_share_of_token_macs": round(head_macs / (head_macs + body_macs), 3),
        "prefill_ms_best": {side: round(ms, 1) for side, ms in best.items()},
        "prefill_ms_per_round": {side: [round(ms, 1) for ms in values] for side, values in times.items()},
        "all_over_last": round(best["all"] / best["last"], 3),
        "last_logits_max_abs_diff": float(np.abs(logits["last"] - logits["all"]).max()),
    }


def _body_macs_per_token(shape: Any) -> int:
    """Multiply-accumulates of one token's projections and MLP (attention scores left out)."""
    kv = shape.kv_heads * shape.head_dim
    per_layer = shape.hidden * (shape.hidden + 2 * kv) + shape.hidden * shape.hidden + 3 * shape.hidden * shape.intermediate
    return shape.layers * per_layer


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = list(result["prefill_ms_best"])
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.bar(sides, [result["prefill_ms_best"][s] for s in sides], color=["C0", "C7"])
    axis.set_ylabel(f"prefill ms, {result['prompt_tokens']} tokens (best of {result['rounds']})")
    axis.set_title(f"LM head over the last position vs all (vocab {result['shape']['vocab']:,})")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=1024, help="prefill chunk length (tokens)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=4864)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--models", default=str(Path.home() / ".cache" / "edge-runtime" / "bench-prefill"))
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args(argv)
    if min(args.prompt, args.rounds, args.threads, args.vocab) < 1:
        parser.error("--prompt, --rounds, --threads and --vocab must be >= 1")
    publish(run(args), args.out, "bench_prefill_logits", plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
