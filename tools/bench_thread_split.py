"""Benchmark: what a row of the PP-OCR classifier costs on one thread and on the two-thread pool, by batch size.

The question behind the scheduler's runs side by side (``edge_runtime/scheduler/single_thread.py``):
whether a batch makes a row cheaper on one thread, or only lets the pool's threads share it. In
process, ONNX Runtime only (no daemon): sessions with one intra-op thread, and with every core
spinning and not spinning (ORT's default and the daemon's quiet setting); batches of 1, 4, 8 and 16
rows; the sessions alternate within every round and the best round is kept. Reports ms per row of
wall time and of core time (wall x threads), and the rows/s two one-thread runs side by side would
reach if nothing else shared the cores (an ideal) against one pool run at a time (ORT's default session one row at a time is the baseline a
user would have). Prints JSON and writes ``bench_thread_split.json`` / ``.png`` to ``--out``.

    python tools/bench_thread_split.py --out bench-results
"""

from __future__ import annotations

import argparse
import os
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
from bench_server_sides import ocr_model  # noqa: E402

BATCHES = (1, 4, 8, 16)
MAX_CALLS = 400  # per timing, bounded in count as well as by --seconds


def sessions(model: Path, cores: int) -> dict[str, Any]:
    import onnxruntime as ort

    def make(threads: int, spin: bool) -> Any:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])

    return {"one_thread": (make(1, False), 1), "pool_spinning": (make(cores, True), cores),
            "pool_quiet": (make(cores, False), cores)}


def ms_per_row(session: Any, feed: dict[str, np.ndarray], rows: int, seconds: float) -> float:
    for _ in range(3):
        session.run(None, feed)
    calls, started = 0, time.perf_counter()
    while calls < MAX_CALLS and time.perf_counter() - started < seconds:
        session.run(None, feed)
        calls += 1
    return (time.perf_counter() - started) / calls / rows * 1e3


def run(args: argparse.Namespace) -> dict[str, Any]:
    cores = args.cores or os.cpu_count() or 1
    x = np.random.default_rng(0).random((1, 3, 48, 192), dtype=np.float32)
    feeds = {rows: {"x": np.repeat(x, rows, axis=0)} for rows in BATCHES}
    measured = sessions(ocr_model("cls"), cores)
    best: dict[str, dict[int, float]] = {name: {} for name in measured}
    for index in range(args.rounds):
        order = list(measured)[index % len(measured):] + list(measured)[:index % len(measured)]
        for name in order:
            session, _ = measured[name]
            for rows in BATCHES:
                value = ms_per_row(session, feeds[rows], rows, args.seconds)
                best[name][rows] = min(best[name].get(rows, float("inf")), value)
    result: dict[str, Any] = {"cores": cores, "rounds": args.rounds, "model": "PP-OCR cls [rows, 3, 48, 192]",
                              "wall_ms_per_row": {}, "core_ms_per_row": {}}
    for name, (_, threads) in measured.items():
        result["wall_ms_per_row"][name] = {str(r): round(v, 4) for r, v in best[name].items()}
        result["core_ms_per_row"][name] = {str(r): round(v * threads, 4) for r, v in best[name].items()}
    one_at_a_time = 1e3 / best["pool_spinning"][1]  # ORT's default session, one row a run
    side_by_side = cores * 1e3 / min(best["one_thread"].values())
    pool_batched = 1e3 / min(min(best["pool_spinning"].values()), min(best["pool_quiet"].values()))
    result["rows_per_s"] = {"ort_default_one_row": round(one_at_a_time, 1),
                            "pool_best_batch": round(pool_batched, 1),
                            f"ideal_{cores}_one_thread_runs_best_batch": round(side_by_side, 1)}
    result["ratios"] = {"pool_best_batch_vs_one_row": round(pool_batched / one_at_a_time, 2),
                        "one_thread_runs_vs_one_row": round(side_by_side / one_at_a_time, 2),
                        "one_thread_best_batch_vs_one_row_on_one_thread":
                            round(best["one_thread"][1] / min(best["one_thread"].values()), 2)}
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, values in result["wall_ms_per_row"].items():
        left.plot([int(r) for r in values], list(values.values()), marker="o", label=name)
    for name, values in result["core_ms_per_row"].items():
        right.plot([int(r) for r in values], list(values.values()), marker="o", label=name)
    left.set_ylabel("wall ms per row")
    right.set_ylabel("core ms per row (wall x threads)")
    for axis in (left, right):
        axis.set_xlabel("rows per run")
        axis.legend()
    figure.suptitle(f"PP-OCR classifier on {result['cores']} cores, best of {result['rounds']} rounds")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.5, help="per timing (also bounded to 400 calls)")
    parser.add_argument("--cores", type=int, default=0, help="pool threads (default: every core)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args(argv)
    publish(run(args), args.out, "bench_thread_split", plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
