"""Benchmark: ONNX Runtime's pool-thread spin settings, in process, as the daemon uses them.

The spin policy (``edge_runtime/scheduler/spin.py``) builds served sessions from
three ORT session entries: ``session.intra_op.allow_spinning``,
``session.force_spinning_stop`` (stop spinning when the last run returns) and
``session.intra_op.spin_duration_us`` (how long one wait spins before sleeping,
the ``[scheduler] spin_wait_us`` setting). This times them on the PP-OCR
text-direction classifier in two patterns the daemon produces:

* ``c1``: one row per run with ``--gap-us`` of busy work on the calling thread
  between runs (at concurrency 1 an HTTP round trip keeps one core busy between
  two runs; the pool threads meanwhile spin or sleep);
* ``batch``: ``--batch`` rows per run, back to back (a device worker draining a queue).

Sessions (all with ``--threads`` intra-op threads): ORT's default (spins after
runs too), spinning off (the quiet twin), the ``load`` mode as served now
(``force_spinning_stop``, ORT's own spin per wait) and with each bound of
``--waits-us``. Every round times every session in both patterns, in a rotating
order; the JSON gives per session and pattern the best and the median over
rounds of the per-run median, in ms per row; ``bench_spin.png`` plots the medians.

    python tools/bench_spin.py --out bench-results          # about 40 s
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
if str(ROOT / "tools") not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT / "tools"))

from bench_report import publish  # noqa: E402
from bench_server_sides import ocr_model  # noqa: E402  (needs the path above)

SHAPE = (1, 3, 48, 192)


def session_entries(waits_us: list[int]) -> dict[str, dict[str, str]]:
    """Label -> ORT session config entries of every compared setting."""
    load = {"session.intra_op.allow_spinning": "1", "session.force_spinning_stop": "1"}
    entries = {"ort_default": {}, "never": {"session.intra_op.allow_spinning": "0"}, "load": load}
    for wait in waits_us:
        entries[f"load_wait{wait}us"] = {**load, "session.intra_op.spin_duration_us": str(wait)}
    return entries


def time_runs(session: Any, feed: dict[str, np.ndarray], gap_s: float, seconds: float) -> float:
    """Median ms of one ``session.run`` over ``seconds``, with ``gap_s`` of busy work between runs."""
    times = []
    stop_at = time.perf_counter() + seconds
    while time.perf_counter() < stop_at:
        started = time.perf_counter()
        session.run(None, feed)
        ended = time.perf_counter()
        times.append(ended - started)
        until = ended + gap_s
        while time.perf_counter() < until:  # busy, as a loop serving HTTP is: it holds its core
            pass
    return float(np.median(times)) * 1e3


def run(args: argparse.Namespace) -> dict[str, Any]:
    import onnxruntime as ort

    path = str(ocr_model("cls"))
    rng = np.random.default_rng(0)
    one = rng.random(SHAPE, dtype=np.float32)
    feeds = {"c1": {"x": one}, "batch": {"x": np.repeat(one, args.batch, axis=0)}}
    rows = {"c1": 1, "batch": args.batch}
    gaps = {"c1": args.gap_us / 1e6, "batch": 0.0}
    sessions = {}
    for label, entries in session_entries(args.waits_us).items():
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        for key, value in entries.items():
            options.add_session_config_entry(key, value)
        sessions[label] = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    for session in sessions.values():  # first runs allocate; keep them out of the rounds
        for pattern in feeds:
            session.run(None, feeds[pattern])
    per_round: dict[tuple[str, str], list[float]] = {}
    labels = list(sessions)
    for index in range(args.rounds):
        shift = index % len(labels)
        for label in labels[shift:] + labels[:shift]:
            for pattern in feeds:
                ms = time_runs(sessions[label], feeds[pattern], gaps[pattern], args.seconds)
                per_round.setdefault((label, pattern), []).append(ms / rows[pattern])
    table = {label: {pattern: {"best_ms_per_row": round(min(per_round[label, pattern]), 3),
                               "median_ms_per_row": round(float(np.median(per_round[label, pattern])), 3)}
                     for pattern in feeds} for label in labels}
    return {"model": "PP-OCR cls " + "x".join(map(str, SHAPE[1:])), "threads": args.threads, "cores": os.cpu_count(),
            "gap_us": args.gap_us, "batch": args.batch, "rounds": args.rounds, "seconds_per_side": args.seconds,
            "load_average": os.getloadavg()[0], "sessions": table,
            "entries": session_entries(args.waits_us)}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(result["sessions"])
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for axis, pattern, title in ((axes[0], "c1", f"1 row, {result['gap_us']} us busy gap between runs"),
                                 (axes[1], "batch", f"{result['batch']} rows, back to back")):
        axis.bar(labels, [result["sessions"][label][pattern]["median_ms_per_row"] for label in labels],
                 color=[f"C{i}" for i in range(len(labels))])
        axis.set_title(title)
        axis.set_ylabel("ms per row (median of rounds)")
        axis.tick_params(axis="x", rotation=30)
    figure.suptitle(f"ORT spin settings, PP-OCR classifier, {result['threads']} threads on {result['cores']} cores "
                    f"(load average {result['load_average']:.1f})")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads (daemon: all cores)")
    parser.add_argument("--gap-us", type=int, default=700, help="busy work between c1 runs (an HTTP round trip)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--waits-us", type=int, nargs="*", default=[100, 1000], help="spin_wait_us bounds to compare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.6, help="per session, pattern and round")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args(argv)
    if args.threads < 1 or args.gap_us < 0 or args.batch < 1 or args.rounds < 1 or args.seconds <= 0:
        parser.error("--threads, --batch, --rounds must be >= 1, --gap-us >= 0, --seconds > 0")
    result = run(args)
    publish(result, args.out, "bench_spin", plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
