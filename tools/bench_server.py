"""Benchmark: the HTTP server against in-process ONNX Runtime on the same model.

Starts ``python -m edge_runtime serve`` in a subprocess on 127.0.0.1 (a free
port, ``tools/cloud_peer.py``) serving the demo CNN (``model_zoo.build_mobilenet``, input [1, 3, 64, 64])
on the ``cpu`` backend, so both sides run the same ONNX Runtime kernels, and
measures with ``tools/loadgen.py``:

* overhead at concurrency 1: server p50 (binary and JSON tensors) minus the p50
  of ``InferenceSession.run`` called in a loop in this process;
* throughput at concurrency 16: server requests/s (without and with the
  scheduler's dynamic batching) vs 16 threads calling ``session.run`` on one
  shared session;
* server RSS (psutil on the PID started here): idle after load, and peak under load.

Prints JSON (with ratios) and writes ``bench_server.json`` and ``bench_server.png``
to ``--out``. Bounded: about ``6 * duration_s`` plus start-up (~55 s by default). The load
generator runs on the same machine and competes with the server for cores.

    python tools/bench_server.py --out bench-results
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tools"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

from cloud_peer import ServerProcess  # noqa: E402  (needs the path above)
from loadgen import run_load  # noqa: E402

MODEL = "demo"
BATCHED = "demo_batched"  # the same model with dynamic batching (max_batch_size 16)


def build_repository(root: Path) -> Path:
    import onnx

    from edge_runtime.model_zoo import build_mobilenet

    model = build_mobilenet()
    for name, batching in ((MODEL, ""), (BATCHED, "[batching]\nmax_batch_size = 16\nmax_queue_delay_us = 2000\n")):
        (root / name / "1").mkdir(parents=True)
        onnx.save(model, str(root / name / "1" / "model.onnx"))
        (root / name / "config.toml").write_text(
            f'[serving]\nbackend = "cpu"\n[queue]\nmax_queue_size = 256\n{batching}')
    return root / MODEL / "1" / "model.onnx"


class RssSampler:
    """Peak resident memory of one process, sampled every 50 ms in a thread."""

    def __init__(self, pid: int) -> None:
        import psutil

        self._process = psutil.Process(pid)
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def rss_bytes(self) -> int:
        return int(self._process.memory_info().rss)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, self.rss_bytes())
            self._stop.wait(0.05)


def ort_baseline(model_path: Path, duration_s: float, threads: int) -> dict[str, Any]:
    """Plain ONNX Runtime: latencies with one caller, and throughput with ``threads`` callers."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    feed = {"input": np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)}
    for _ in range(5):
        session.run(None, feed)

    def loop(stop_at: float) -> list[float]:
        samples = []
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            session.run(None, feed)
            samples.append((time.perf_counter() - started) * 1e3)
        return samples

    single = loop(time.monotonic() + duration_s)
    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        counts = [len(s) for s in pool.map(loop, [started + duration_s] * threads)]
    elapsed = time.monotonic() - started
    return {"p50_ms": round(float(np.percentile(single, 50)), 3), "p95_ms": round(float(np.percentile(single, 95)), 3),
            "rps_c1": round(len(single) / duration_s, 2), "rps_c16": round(sum(counts) / elapsed, 2)}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = ["ORT in-process", "server binary", "server JSON"]
    p50 = [result["onnxruntime"]["p50_ms"], result["server_c1_binary"]["latency_ms"]["p50"],
           result["server_c1_json"]["latency_ms"]["p50"]]
    p95 = [result["onnxruntime"]["p95_ms"], result["server_c1_binary"]["latency_ms"]["p95"],
           result["server_c1_json"]["latency_ms"]["p95"]]
    x = np.arange(len(names))
    left.bar(x - 0.2, p50, 0.4, label="p50")
    left.bar(x + 0.2, p95, 0.4, label="p95")
    left.set_xticks(x, names)
    left.set_ylabel("ms per request (concurrency 1)")
    left.legend()
    right.bar(["ORT 16 threads", "server c=16", "server c=16\nbatching 16"],
              [result["onnxruntime"]["rps_c16"], result["server_c16"]["rps"], result["server_c16_batched"]["rps"]])
    right.set_ylabel("requests/s (concurrency 16)")
    figure.suptitle("edge-runtime server vs plain ONNX Runtime (demo CNN, batch 1)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=6.0, help="seconds per measured phase (default 6)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-server-") as tmp:
        model_path = build_repository(Path(tmp) / "repository")
        # EDGE_RUNTIME_THREADS=0: all usable cores, as the in-process baseline session gets.
        server_process = ServerProcess.start(Path(tmp) / "repository", Path(tmp) / "server.log", timeout_s=90,
                                             env={"EDGE_RUNTIME_CACHE": str(Path(tmp) / "cache"),
                                                  "EDGE_RUNTIME_THREADS": "0"})
        url = server_process.url
        try:
            sampler = RssSampler(server_process.process.pid)
            asyncio.run(run_load(url, MODEL, concurrency=1, duration_s=1.0, binary=True))  # warm-up
            idle_rss = sampler.rss_bytes()
            with sampler:
                phases = {
                    "server_c1_binary": (MODEL, dict(concurrency=1, binary=True)),
                    "server_c1_json": (MODEL, dict(concurrency=1, binary=False)),
                    "server_c16": (MODEL, dict(concurrency=16, binary=True)),
                    "server_c16_batched": (BATCHED, dict(concurrency=16, binary=True)),
                }
                server = {name: asyncio.run(run_load(url, model, duration_s=args.duration_s, **kw))
                          for name, (model, kw) in phases.items()}
        finally:
            server_process.stop()
        baseline = ort_baseline(model_path, args.duration_s, threads=16)
    result: dict[str, Any] = {
        "model": "demo CNN (model_zoo.build_mobilenet), input [1, 3, 64, 64], cpu backend",
        "cores": os.cpu_count(),
        "onnxruntime": baseline,
        **server,
        "server_rss_mb": {"idle": round(idle_rss / 2**20, 1), "peak_under_load": round(sampler.peak_bytes / 2**20, 1)},
    }
    ort_p50 = baseline["p50_ms"]
    result["ratios"] = {
        "overhead_ms_p50_binary": round(server["server_c1_binary"]["latency_ms"]["p50"] - ort_p50, 3),
        "overhead_ms_p50_json": round(server["server_c1_json"]["latency_ms"]["p50"] - ort_p50, 3),
        "latency_ratio_c1_binary": round(server["server_c1_binary"]["latency_ms"]["p50"] / ort_p50, 2),
        "throughput_ratio_c16": round(server["server_c16"]["rps"] / max(baseline["rps_c16"], 1e-9), 2),
        "throughput_ratio_c16_batched": round(server["server_c16_batched"]["rps"] / max(baseline["rps_c16"], 1e-9), 2),
    }
    (args.out / "bench_server.json").write_text(json.dumps(result, indent=2))
    plot(result, args.out / "bench_server.png")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
