"""Benchmark: screenshots of concurrent requests encoded in turn (what the engine does) or at once.

Each request prepares its images on its own thread (``GenerativeModel.prepare``: decode,
preprocess, vision encoder, splice). ``VisionEncoder`` lets one encode run at a time; before,
concurrent encodes ran together and shared the model's threads. The "at once" side swaps the
encoder's turn lock for a no-op, which is exactly that earlier behaviour.

Model: ``tools/bench_vlm.py``'s random-weight Qwen2-VL (vision depth 8) at its ~1,024-token budget
(``--budget 256`` for the other), ``--requests`` agent steps started together, each with its own new
1080x2400 screenshot; the two sides alternate round by round; best of rounds. Reported per side: the
mean and the last request's time to prepared (ms). (Memory is not compared: both sides run in one
process, whose allocator keeps the first peak.) Prints JSON, writes a PNG.

Usage: ``python tools/bench_encode_turns.py [--requests 2] [--rounds 3] [--budget 1024] [--out DIR]``
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tools"):
    if str(_path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(_path))

from bench_report import publish  # noqa: E402
from bench_vlm import BUDGETS, build_folders, edge_model, screenshot, system_prompt  # noqa: E402


def side(model: Any, requests: list[list[dict[str, Any]]]) -> dict[str, float]:
    """Prepare ``requests`` on one thread each, started together."""
    done: list[float] = []
    started = time.perf_counter()

    def work(messages: list[dict[str, Any]]) -> None:
        model.prepare(messages=messages)
        done.append(time.perf_counter() - started)

    threads = [threading.Thread(target=work, args=(m,)) for m in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"mean_ms": sum(done) / len(done) * 1e3, "last_ms": max(done) * 1e3}


def run(args: argparse.Namespace) -> dict[str, Any]:
    _, folder = build_folders(args.models, quick=False)
    model = edge_model(folder, args.threads, BUDGETS[args.budget], {})
    system = system_prompt()
    turns = model.prompter.encoder._turn  # noqa: SLF001 (the benchmark swaps the engine's own lock)
    shot = iter(range(1000, 10_000))  # a new screenshot for every request: no feature-cache hits

    def requests() -> list[list[dict[str, Any]]]:
        return [[{"role": "system", "content": system},
                 {"role": "user", "content": [{"type": "image", "image": screenshot(next(shot))},
                                              {"type": "text", "text": "Open the settings app."}]}]
                for _ in range(args.requests)]

    model.prepare(messages=requests()[0])  # first-run allocations out of the way
    rounds: dict[str, list[dict[str, float]]] = {"in turn": [], "at once": []}
    try:
        for _ in range(args.rounds):
            for name in rounds:
                model.prompter.encoder._turn = turns if name == "in turn" else contextlib.nullcontext()
                rounds[name].append(side(model, requests()))
    finally:
        model.prompter.encoder._turn = turns
        model.close()
    best = {name: {key: round(min(r[key] for r in rows), 1) for key in rows[0]} for name, rows in rounds.items()}
    return {"threads": args.threads, "budget": args.budget, "requests": args.requests, "rounds": args.rounds,
            "best": best,
            "mean_at_once_over_in_turn": round(best["at once"]["mean_ms"] / best["in turn"]["mean_ms"], 2),
            "last_at_once_over_in_turn": round(best["at once"]["last_ms"] / best["in turn"]["last_ms"], 2)}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["best"])
    fig, axis = plt.subplots(figsize=(7, 4))
    for offset, key in ((-0.2, "mean_ms"), (0.2, "last_ms")):
        axis.bar([i + offset for i in range(len(names))], [report["best"][n][key] for n in names], 0.4, label=key)
    axis.set_xticks(range(len(names)), names)
    axis.set_ylabel(f"ms to prepared, {report['requests']} requests at once")
    axis.set_title(f"vision encodes of concurrent requests (~{report['budget']} image tokens)")
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="1024")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "encode-turns")
    parser.add_argument("--models", type=Path, default=Path.home() / ".cache" / "edge-runtime" / "bench-vlm")
    args = parser.parse_args(argv)
    report = run(args)
    report["command"] = " ".join([Path(sys.executable).name, *sys.argv])
    publish(report, args.out, "bench_encode_turns", plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
