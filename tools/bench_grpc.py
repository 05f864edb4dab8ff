"""Benchmark: the daemon's gRPC service against its HTTP routes and in-process ONNX Runtime.

One ``edge-runtime serve --grpc-port`` process serves the PP-OCR text-direction classifier (``cls``,
FP32 ``[1, 3, 48, 192]``, from the ``rapidocr-onnxruntime`` wheel) on its default configuration
(``auto`` plan, batching up to 16). Each transport is driven by its reference client, the one a
user would call: ``tritonclient.http`` (binary tensors) and ``tritonclient.grpc``, synchronous at
c=1 and their asyncio clients (``tritonclient.http.aio``, ``tritonclient.grpc.aio``) at c=16. In-process
ONNX Runtime answering one request at a time is the baseline of both (the better of its default
session and spinning off, per round). Sides are interleaved in every round and the best of the
rounds kept; the client shares this machine's cores with the daemon.

Reports per transport: c=1 p50 and its overhead over in-process ORT's p50, c=16 requests/s and its
ratio to ORT one at a time. Prints JSON and writes ``bench_grpc.json`` / ``bench_grpc.png`` to ``--out``.

    python tools/bench_grpc.py --rounds 3 --out bench-results
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tools"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

from bench_report import publish  # noqa: E402
from bench_server_sides import _stats, ocr_model, ort_loop  # noqa: E402
from cloud_peer import ServerProcess, free_port  # noqa: E402

SHAPE = (1, 3, 48, 192)
CONFIG = '[batching]\nmax_batch_size = 16\nmax_queue_delay_us = 1000\n[queue]\nmax_queue_size = 256\n'


def sync_loop(call: Callable[[], Any], duration_s: float) -> dict[str, Any]:
    """One client calling back to back for ``duration_s``."""
    latencies = []
    started = time.monotonic()
    while time.monotonic() - started < duration_s:
        begin = time.perf_counter()
        call()
        latencies.append((time.perf_counter() - begin) * 1e3)
    return _stats(latencies, time.monotonic() - started)


async def async_loop(make_call: Callable[[], Any], concurrency: int, duration_s: float) -> dict[str, Any]:
    """``concurrency`` coroutines calling back to back for ``duration_s``."""
    latencies: list[float] = []
    stop_at = time.monotonic() + duration_s

    async def worker() -> None:
        while time.monotonic() < stop_at:
            begin = time.perf_counter()
            await make_call()
            latencies.append((time.perf_counter() - begin) * 1e3)

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return _stats(latencies, time.monotonic() - started)


def _inputs(module: Any, x: np.ndarray, binary: bool) -> list[Any]:
    item = module.InferInput("x", list(x.shape), "FP32")
    if binary:
        item.set_data_from_numpy(x, binary_data=True)
    else:
        item.set_data_from_numpy(x)
    return [item]


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import onnxruntime as ort
    import tritonclient.grpc as tgrpc
    import tritonclient.grpc.aio as agrpc
    import tritonclient.http as thttp
    import tritonclient.http.aio as ahttp

    model = ocr_model("cls")
    repository = tmp / "repository"
    (repository / "cls" / "1").mkdir(parents=True)
    (repository / "cls" / "1" / "model.onnx").write_bytes(model.read_bytes())
    (repository / "cls" / "config.toml").write_text(CONFIG)
    grpc_port = free_port()
    server = ServerProcess.start(repository, tmp / "serve.log", env={"EDGE_RUNTIME_CACHE": str(tmp / "cache")},
                                 timeout_s=300, args=["--grpc-port", str(grpc_port)])
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    sessions = {}
    for label, spinning in (("default", True), ("nospin", False)):
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        if not spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions[label] = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    http = thttp.InferenceServerClient(f"127.0.0.1:{server.port}", connection_timeout=60, network_timeout=120)
    grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    http_inputs, grpc_inputs = _inputs(thttp, x, True), _inputs(tgrpc, x, False)
    http_out = [thttp.InferRequestedOutput(o.name, binary_data=True) for o in sessions["default"].get_outputs()]
    expected = sessions["default"].run(None, {"x": x})[0]
    for answer in (http.infer("cls", http_inputs, outputs=http_out), grpc.infer("cls", grpc_inputs)):
        name = sessions["default"].get_outputs()[0].name
        np.testing.assert_allclose(answer.as_numpy(name), expected, rtol=1e-4, atol=1e-5)  # the same answer

    async def concurrent(kind: str) -> dict[str, Any]:
        if kind == "http":
            client = ahttp.InferenceServerClient(f"127.0.0.1:{server.port}", conn_limit=args.concurrency)
            inputs = _inputs(ahttp, x, True)
            outputs = [ahttp.InferRequestedOutput(o.name, binary_data=True) for o in sessions["default"].get_outputs()]
            make = lambda: client.infer("cls", inputs, outputs=outputs)  # noqa: E731
        else:
            client = agrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            inputs = _inputs(agrpc, x, False)
            make = lambda: client.infer("cls", inputs)  # noqa: E731
        try:
            await async_loop(make, args.concurrency, 0.5)  # connections up, batches forming
            return await async_loop(make, args.concurrency, args.seconds)
        finally:
            await client.close()

    rounds = []
    try:
        for _ in range(args.rounds):
            row: dict[str, Any] = {}
            for label, session in sessions.items():
                row[f"ort_{label}"] = ort_loop(session, {"x": x}, args.seconds)
            row["http_c1"] = sync_loop(lambda: http.infer("cls", http_inputs, outputs=http_out), args.seconds)
            row["grpc_c1"] = sync_loop(lambda: grpc.infer("cls", grpc_inputs), args.seconds)
            row["http_c16"] = asyncio.run(concurrent("http"))
            row["grpc_c16"] = asyncio.run(concurrent("grpc"))
            rounds.append(row)
    finally:
        http.close()
        grpc.close()
        server.stop()
    return summarise(rounds, args)


def summarise(rounds: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    ort_p50 = min(min(r["ort_default"]["p50_ms"], r["ort_nospin"]["p50_ms"]) for r in rounds)
    ort_rps = max(max(r["ort_default"]["rps"], r["ort_nospin"]["rps"]) for r in rounds)
    table = {}
    for transport in ("http", "grpc"):
        p50 = min(r[f"{transport}_c1"]["p50_ms"] for r in rounds)
        rps = max(r[f"{transport}_c16"]["rps"] for r in rounds)
        table[transport] = {"c1_p50_ms": p50, "c1_overhead_ms": round(p50 - ort_p50, 3), "c16_rps": rps,
                            "c16_vs_ort_one_at_a_time": round(rps / ort_rps, 2)}
    return {"model": "PP-OCR cls [1,3,48,192] FP32", "threads": args.threads, "rounds": args.rounds,
            "seconds_per_side": args.seconds, "concurrency": args.concurrency,
            "ort_one_at_a_time": {"p50_ms": ort_p50, "rps": ort_rps}, "transports": table,
            "grpc_over_http": {"c1_p50": round(table["grpc"]["c1_p50_ms"] / table["http"]["c1_p50_ms"], 2),
                               "c16_rps": round(table["grpc"]["c16_rps"] / table["http"]["c16_rps"], 2)},
            "per_round": rounds}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = result["transports"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    names = ["ORT in process", "HTTP", "gRPC"]
    left.bar(names, [result["ort_one_at_a_time"]["p50_ms"], table["http"]["c1_p50_ms"], table["grpc"]["c1_p50_ms"]],
             color=["#999", "#4a7", "#47a"])
    left.set_title("c=1 p50 (ms, lower is better)")
    right.bar(names, [result["ort_one_at_a_time"]["rps"], table["http"]["c16_rps"], table["grpc"]["c16_rps"]],
              color=["#999", "#4a7", "#47a"])
    right.set_title(f"c={result['concurrency']} requests/s (ORT: one at a time)")
    figure.suptitle(f"{result['model']}, best of {result['rounds']} interleaved rounds")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="per side and round")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="in-process ORT's intra-op threads")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-grpc-") as tmp:
        result = run(args, Path(tmp))
    publish(result, args.out, "bench_grpc", plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
