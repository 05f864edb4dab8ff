"""Benchmark: a quantized decoder's footprint on disk and in memory, its embedding table quantized or float.

``edge-runtime quantize FOLDER --mode int4|int8`` stores the token-embedding table in the weights'
bits (``GatherBlockQuantized``); ``--float-embeddings`` keeps it float, as every quantized folder
was before. The table is the largest tensor of a small model at a real vocabulary, so this runs
Qwen2.5-0.5B's shape *with its 151,936-token vocabulary* (``bench_generate``'s 0.5B keeps 16k),
random weights, against what a phone user would pick instead: llama.cpp's q4_0 and q8_0 GGUF of
the same checkpoint (``convert_hf_to_gguf.py`` and its quantizer, ``tools/llamacpp_worker.py``).

Every side runs in a fresh process of its own per round (rounds interleaved): it loads the model,
generates ``--new-tokens`` greedy tokens after a 64-token prompt on ``--threads`` threads, and
reports its resident memory from ``/proc`` (``VmRSS``, split into anonymous and file-backed pages,
``RssAnon`` / ``RssFile``), decode tokens/s and time to first token. Ours: ``GenerativeModel``
with one sequence of up to ``CONTEXT`` tokens; llama.cpp: ``n_ctx`` = ``CONTEXT``. Memory is the
largest over rounds, speed the best. Prints JSON and writes ``bench_decoder_memory.json`` and
``.png`` to ``--out``. Building the folders takes ~5 minutes the first time (cached in ``--models``).

    EDGE_RUNTIME_LLAMACPP_PYTHON=/tmp/edge-runtime-llamacpp/bin/python \\
        python tools/bench_decoder_memory.py --rounds 3 --out bench-results
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tools"):
    if str(_path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(_path))

from bench_report import publish  # noqa: E402
from generate_peers import JsonWorker, llamacpp_workers  # noqa: E402
from hf_decoders import DecoderSpec, hf_folder  # noqa: E402

SPEC = DecoderSpec(arch="qwen2", hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936,
                   max_positions=2048, seed=0)
CONTEXT = 2048
PROMPT = [(17 * i + 11) % 5000 + 10 for i in range(64)]  # ids the locally trained tokenizer has
# side -> (quantize mode, kernel, accuracy level, embeddings quantized). The kernels ``quantize``'s auto
# chose for this shape on the hosts measured: MatMulNBits level 4 for int4, per-token MatMulInteger for int8.
OURS = {"ours int4": ("int4", "matmulnbits", 4, True), "ours int4, float embeddings": ("int4", "matmulnbits", 4, False),
        "ours int8": ("int8", "matmulinteger", "auto", True),
        "ours int8, float embeddings": ("int8", "matmulinteger", "auto", False)}
LLAMACPP = {"llama.cpp q4_0": "q4_0", "llama.cpp q8_0": "q8_0"}


def memory(pid: int | str = "self") -> dict[str, float]:
    """Resident memory of process ``pid`` in MiB: total, anonymous and file-backed pages."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) / 1024
    return {"rss_mib": fields["VmRSS"], "anon_mib": fields["RssAnon"], "file_mib": fields["RssFile"]}


def run_ours(folder: Path, threads: int, new: int) -> dict[str, Any]:
    """One side of ours in this process (``--side``): load, generate, measure."""
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings

    settings = GenerationSettings(max_batch_size=1, threads=threads, max_seq_len=CONTEXT)
    model = GenerativeModel("bench-memory", folder, settings)
    try:
        result = model.generate(PROMPT, max_tokens=new, ignore_eos=True)
        first = result.time_to_first_token_s or 0.0
        return {"ttft_ms": first * 1e3, "decode_tokens_per_s": (new - 1) / (result.elapsed_s - first),
                **memory()}
    finally:
        model.close()


def side_ours(folder: Path, threads: int, new: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--side", str(folder), "--threads", str(threads),
                          "--new-tokens", str(new)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def side_llamacpp(python: str, gguf: Path, threads: int, new: int) -> dict[str, Any]:
    worker = JsonWorker([python, str(ROOT / "tools" / "llamacpp_worker.py"), "serve", str(gguf), str(threads),
                         str(CONTEXT)], f"llama.cpp {gguf.stem}")
    try:
        answer = worker.ask(cmd="single", prompt=PROMPT, new=new)
        return {"ttft_ms": answer["ttft_ms"], "decode_tokens_per_s": answer["decode_tokens_per_s"],
                **memory(worker.process.pid)}
    finally:
        worker.close()


def build(models: Path, llamacpp: str | None, threads: int) -> tuple[dict[str, Path], dict[str, Path]]:
    """Our quantized folders and llama.cpp's GGUF files of the one checkpoint (cached in ``models``)."""
    from edge_runtime.decoder_zoo import decoder_folder_from_hf
    from edge_runtime.optimize.decoder_quant import quantize_decoder

    hf = hf_folder(SPEC, models)
    fused = models / f"fused-{SPEC.key}"
    if not (fused / "model.onnx").is_file():
        decoder_folder_from_hf(hf, fused, fused=True)
    ours = {}
    for side, (mode, kernel, level, embeddings) in OURS.items():
        folder = models / f"memory-{mode}-{'q' if embeddings else 'f'}emb-{SPEC.key}"
        if not (folder / "model.onnx").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            quantize_decoder(fused, folder, mode, kernel=kernel, accuracy_level=level, embeddings=embeddings,
                             threads=threads)
        ours[side] = folder
    ggufs = {}
    if llamacpp:
        gguf_folder = models / f"gguf-{SPEC.key}"
        for worker in llamacpp_workers(llamacpp, hf, gguf_folder, threads, CONTEXT).values():
            worker.close()  # the files are what is wanted here; each round starts its own process
        ggufs = {side: gguf_folder / f"{name}.gguf" for side, name in LLAMACPP.items()}
    return ours, ggufs


def disk_mib(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.iterdir() if p.name.startswith("model.onnx")]
    return sum(p.stat().st_size for p in files) / 2**20


def run(args: argparse.Namespace) -> dict[str, Any]:
    llamacpp = os.environ.get("EDGE_RUNTIME_LLAMACPP_PYTHON")
    ours, ggufs = build(args.models, llamacpp, args.threads)
    rounds: dict[str, list[dict[str, Any]]] = {side: [] for side in [*ours, *ggufs]}
    for _ in range(args.rounds):
        for side, folder in ours.items():
            rounds[side].append(side_ours(folder, args.threads, args.new_tokens))
        for side, gguf in ggufs.items():
            rounds[side].append(side_llamacpp(llamacpp, gguf, args.threads, args.new_tokens))  # type: ignore[arg-type]
    sides = {}
    for side, entries in rounds.items():
        path = ours.get(side) or ggufs[side]
        sides[side] = {"disk_mib": round(disk_mib(path), 1),
                       **{key: round(max(e[key] for e in entries), 1) for key in ("rss_mib", "anon_mib", "file_mib")},
                       "decode_tokens_per_s": round(max(e["decode_tokens_per_s"] for e in entries), 2),
                       "ttft_ms": round(min(e["ttft_ms"] for e in entries), 1)}
    ratios = {}
    for mode, peer in (("int4", "llama.cpp q4_0"), ("int8", "llama.cpp q8_0")):
        quantized, kept = sides[f"ours {mode}"], sides[f"ours {mode}, float embeddings"]
        ratios[mode] = {"disk_vs_float_embeddings": round(quantized["disk_mib"] / kept["disk_mib"], 3),
                        "rss_vs_float_embeddings": round(quantized["rss_mib"] / kept["rss_mib"], 3),
                        "decode_vs_float_embeddings": round(quantized["decode_tokens_per_s"]
                                                            / kept["decode_tokens_per_s"], 3)}
        if peer in sides:
            ratios[mode].update(disk_vs_llamacpp=round(quantized["disk_mib"] / sides[peer]["disk_mib"], 3),
                                rss_vs_llamacpp=round(quantized["rss_mib"] / sides[peer]["rss_mib"], 3),
                                decode_vs_llamacpp=round(quantized["decode_tokens_per_s"]
                                                         / sides[peer]["decode_tokens_per_s"], 3))
    return {"model": {"shape": "Qwen2.5-0.5B with its 151,936-token vocabulary, random weights",
                      "hidden": SPEC.hidden, "layers": SPEC.layers, "vocab": SPEC.vocab},
            "threads": args.threads, "rounds": args.rounds, "new_tokens": args.new_tokens, "context": CONTEXT,
            "sides": sides, "ratios": ratios,
            "llamacpp": "measured" if ggufs else "left out (set EDGE_RUNTIME_LLAMACPP_PYTHON)"}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["sides"])
    figure, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    x = range(len(names))
    for axis, keys, title in ((axes[0], ("disk_mib", "rss_mib"), "MiB on disk and resident after generating"),
                              (axes[1], ("decode_tokens_per_s",), "decode tokens/s (best of rounds)")):
        width = 0.8 / len(keys)
        for i, key in enumerate(keys):
            axis.bar([p + i * width for p in x], [result["sides"][n][key] for n in names], width, label=key)
        axis.set_xticks([p + 0.4 - width / 2 for p in x], names, rotation=25, ha="right", fontsize=8)
        axis.set_title(title, fontsize=10)
        axis.legend(fontsize=8)
    figure.suptitle(f"{result['model']['shape']}, {result['threads']} threads")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--models", type=Path, default=Path.home() / ".cache" / "edge-runtime" / "bench-models")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--side", type=Path, help=argparse.SUPPRESS)  # internal: one of our sides, this process
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.threads < 1 or not 2 <= args.new_tokens <= CONTEXT - len(PROMPT):
        parser.error("--rounds and --threads must be >= 1, --new-tokens from 2 to the context left after the prompt")
    if args.side is not None:
        print(json.dumps(run_ours(args.side, args.threads, args.new_tokens)))
        return 0
    args.models.mkdir(parents=True, exist_ok=True)
    publish(run(args), args.out, "bench_decoder_memory", plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
