"""Benchmark: where the daemon's c=1 overhead over in-process ONNX Runtime goes, against floors.

One request at a time (binary v2 tensors, the aiohttp client of ``bench_server``) to the
PP-OCR classifier ``[1, 3, 48, 192]``, sides interleaved in every round, best p50 of the rounds:

* ``ort``: plain in-process ``InferenceSession.run`` (ORT's default session), the baseline;
* ``daemon``: ``edge-runtime serve`` on the default configuration with ``[batching]
  max_batch_size = 16`` (as ``bench_server`` serves it): an idle model's short run goes on the
  event loop (``scheduler/inline.py``);
* ``daemon_threaded``: the same with ``[scheduler] inline_max_ms = 0``: every run in a device
  worker's thread;
* ``floor_canned``: a bare aiohttp server (``tools/c1_floor_server.py``) that answers the
  daemon's own response bytes without running anything: client + HTTP + loopback;
* ``floor_<spin>``: the same bare server running the model once per request in the default
  executor thread, its session spinning as ORT does by default (``ort``), as the daemon's
  ``spin = "load"`` does (``load``) or not at all (``never``).

``floor_load`` is the least a server of this design (aiohttp, compute off the loop, the daemon's
session settings) can add here; the daemon minus ``floor_load`` is its own machinery
(validation, scheduling, statistics, spin switching, codec). Prints JSON and writes
``bench_c1_floor.json`` and ``bench_c1_floor.png`` to ``--out``. About 1.5 minutes.

    python tools/bench_c1_floor.py --rounds 4 --out bench-results
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tools"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

from bench_report import publish  # noqa: E402
from bench_server_sides import HEADER_LENGTH, closed_loop, ocr_model, ort_loop, request_body  # noqa: E402
from cloud_peer import ServerProcess, free_port  # noqa: E402

SHAPE = (1, 3, 48, 192)
CONFIG = "[batching]\nmax_batch_size = 16\nmax_queue_delay_us = 1000\n"
THREADED = "[scheduler]\ninline_max_ms = 0\n"
FLOORS = ("canned", "ort", "load", "never")


async def _one_response(url: str, body: tuple[bytes, dict[str, str]]) -> tuple[bytes, str]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v2/models/cls/infer", data=body[0], headers=body[1]) as response:
            return await response.read(), response.headers[HEADER_LENGTH]


def _floor(kind: str, model: Path, response: Path, header_length: str, log: Path) -> ServerProcess:
    port = free_port()
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "tools" / "c1_floor_server.py"), "--port", str(port), "--model", str(model),
             "--response", str(response), "--header-length", header_length, "--session", kind],
            stdout=out, stderr=subprocess.STDOUT)
    server = ServerProcess(response.parent, port, process, log)
    server.wait_ready(60.0)
    return server


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import onnxruntime as ort

    model = ocr_model("cls")
    for repository, config in (("repository", CONFIG), ("repository-threaded", THREADED + CONFIG)):
        folder = tmp / repository / "cls"
        (folder / "1").mkdir(parents=True)
        (folder / "1" / "model.onnx").write_bytes(model.read_bytes())
        (folder / "config.toml").write_text(config)
    x = np.random.default_rng(0).random(SHAPE, dtype=np.float32)
    body = request_body("x", x)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    servers: dict[str, ServerProcess] = {}
    try:
        for name, repository in (("daemon", "repository"), ("daemon_threaded", "repository-threaded")):
            servers[name] = ServerProcess.start(tmp / repository, tmp / f"{name}.log", timeout_s=120,
                                                env={"EDGE_RUNTIME_CACHE": str(tmp / "cache"),
                                                     "EDGE_RUNTIME_THREADS": "0"})
        raw, header_length = asyncio.run(_one_response(servers["daemon"].url, body))
        (tmp / "response.bin").write_bytes(raw)
        for kind in FLOORS:
            servers[f"floor_{kind}"] = _floor(kind, model, tmp / "response.bin", header_length, tmp / f"{kind}.log")
        for server in servers.values():  # warm-up: sessions, connection paths, the daemon's first-request work
            asyncio.run(closed_loop(server.url, "cls", body, 1, 1.0))
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in ("ort", *servers)}
        for _ in range(args.rounds):
            rounds["ort"].append(ort_loop(session, {"x": x}, args.seconds))
            for name, server in servers.items():
                rounds[name].append(asyncio.run(closed_loop(server.url, "cls", body, 1, args.seconds)))
    finally:
        for server in servers.values():
            server.stop()
    best = {name: min(entries, key=lambda entry: entry["p50_ms"]) for name, entries in rounds.items()}
    base = best["ort"]["p50_ms"]
    return {
        "rounds": args.rounds, "seconds_per_side": args.seconds,
        "p50_ms": {name: entry["p50_ms"] for name, entry in best.items()},
        "p50_ms_per_round": {name: [entry["p50_ms"] for entry in entries] for name, entries in rounds.items()},
        "over_ort_ms": {name: round(entry["p50_ms"] - base, 3) for name, entry in best.items() if name != "ort"},
        "daemon_over_floor_load_ms": round(best["daemon"]["p50_ms"] - best["floor_load"]["p50_ms"], 3),
        "daemon_server_us": best["daemon"].get("server_us"),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["p50_ms"])
    figure, axis = plt.subplots(figsize=(9, 4.5))
    axis.bar(names, [result["p50_ms"][n] for n in names], color=["C2", "C0", "C0", "C7", "C1", "C1", "C3"][:len(names)])
    axis.set_ylabel("p50 ms, one request at a time (best round)")
    axis.set_title("c=1 on the PP-OCR classifier: daemon vs bare aiohttp floors vs in-process ORT")
    axis.tick_params(axis="x", labelrotation=20)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=2.5, help="per side per round")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds must be >= 1 and --seconds > 0")
    with tempfile.TemporaryDirectory(prefix="edge-runtime-c1-floor-") as tmp:
        result = run(args, Path(tmp))
    publish(result, args.out, "bench_c1_floor", plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
