"""Load generator for a KServe v2 endpoint (edge-runtime, Triton, KServe, MLServer).

Closed loop: ``--concurrency N`` workers each send the next request as soon as
the previous one is answered. Open loop: ``--rate R`` requests per second are
started on schedule whether or not earlier ones finished (in-flight capped by
``--max-in-flight``; a request that cannot start on time counts as
``dropped``). Both stop at ``--duration-s`` or ``--max-requests``, whichever
comes first. Prints one JSON object: rps, latency percentiles of answered
requests, and error counts by HTTP status (``connection`` for transport errors).

    python tools/loadgen.py --url http://127.0.0.1:8080 --model demo --concurrency 4 --duration-s 10
    python tools/loadgen.py --model demo --rate 50 --binary --duration-s 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))


@dataclass
class LoadResult:
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    dropped: int = 0
    started_s: float = 0.0
    finished_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        elapsed_s = max(self.finished_s - self.started_s, 1e-9)
        ok = self.statuses.get("200", 0)
        lat = np.asarray(self.latencies_ms or [float("nan")])
        return {
            "requests": sum(self.statuses.values()),
            "ok": ok,
            "duration_s": round(elapsed_s, 3),
            "rps": round(ok / elapsed_s, 2),
            "latency_ms": {"p50": _pct(lat, 50), "p95": _pct(lat, 95), "p99": _pct(lat, 99),
                           "mean": round(float(np.mean(lat)), 3), "max": round(float(np.max(lat)), 3)},
            "errors": {status: n for status, n in sorted(self.statuses.items()) if status != "200"},
            "dropped": self.dropped,
        }


def _pct(values: np.ndarray, q: float) -> float:
    return round(float(np.percentile(values, q)), 3)


def build_request(metadata: dict[str, Any], batch: int, binary: bool, seed: int = 0) -> tuple[bytes, dict[str, str]]:
    """One request body for the model described by ``metadata`` (dynamic dims become ``batch``)."""
    from edge_runtime.protocol.codec import DATATYPES, encode_request

    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in metadata["inputs"]:
        shape = [batch if d < 0 else d for d in spec["shape"]]
        dtype = np.dtype(DATATYPES[spec["datatype"]])
        if spec["datatype"] == "BYTES":
            array = np.full(shape, b"x", dtype=object)
        elif dtype.kind == "f":
            array = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            array = rng.random(shape) < 0.5
        else:
            array = rng.integers(0, 8, size=shape).astype(dtype)
        inputs[spec["name"]] = array
    encoded = encode_request(inputs, binary=binary, parameters={"binary_data_output": binary})
    headers = {"Content-Type": encoded.content_type}
    if encoded.header_length is not None:
        headers["Inference-Header-Content-Length"] = str(encoded.header_length)
    return encoded.body, headers


async def run_load(url: str, model: str, *, concurrency: int = 1, rate: float | None = None,
                   duration_s: float = 10.0, max_requests: int = 100_000, batch: int = 1, binary: bool = False,
                   token: str | None = None, max_in_flight: int = 256, timeout_s: float = 30.0) -> dict[str, Any]:
    """Drive ``url``/v2/models/``model``/infer and return the summary (see module docstring)."""
    import aiohttp

    auth = {"Authorization": f"Bearer {token}"} if token else {}
    connector = aiohttp.TCPConnector(limit=max(concurrency, max_in_flight if rate else 0, 1))
    async with aiohttp.ClientSession(connector=connector, headers=auth,
                                     timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.get(f"{url}/v2/models/{model}") as response:
            if response.status != 200:
                raise SystemExit(f"loadgen: GET /v2/models/{model} -> {response.status}: {await response.text()}")
            metadata = await response.json()
        body, headers = build_request(metadata, batch, binary)
        target = f"{url}/v2/models/{model}/infer"
        result = LoadResult()
        stop_at = time.monotonic() + duration_s
        budget = [max_requests]

        async def one() -> None:
            started = time.perf_counter()
            try:
                async with session.post(target, data=body, headers=headers) as response:
                    await response.read()
                    status = str(response.status)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                status = "connection"
            result.statuses[status] += 1
            if status == "200":
                result.latencies_ms.append((time.perf_counter() - started) * 1e3)

        def take() -> bool:
            if budget[0] <= 0 or time.monotonic() >= stop_at:
                return False
            budget[0] -= 1
            return True

        result.started_s = time.monotonic()
        if rate:
            await _open_loop(one, take, rate, max_in_flight, result)
        else:
            async def worker() -> None:
                while take():
                    await one()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.finished_s = time.monotonic()
    summary = result.summary()
    summary.update({"url": url, "model": model, "mode": "open" if rate else "closed", "batch": batch,
                    "binary": binary, **({"rate": rate} if rate else {"concurrency": concurrency})})
    return summary


async def _open_loop(one: Any, take: Any, rate: float, max_in_flight: int, result: LoadResult) -> None:
    interval_s = 1.0 / rate
    running: set[asyncio.Task] = set()
    next_at = time.monotonic()
    while take():
        delay = next_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        next_at += interval_s
        if len(running) >= max_in_flight:
            result.dropped += 1  # the schedule is not kept waiting for a slow server
            continue
        task = asyncio.get_running_loop().create_task(one())
        running.add(task)
        task.add_done_callback(running.discard)
    if running:
        await asyncio.gather(*running)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--model", default="demo")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int, default=1, help="closed loop: requests in flight (default 1)")
    mode.add_argument("--rate", type=float, help="open loop: requests per second")
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--max-in-flight", type=int, default=256, help="open loop: cap on requests in flight")
    parser.add_argument("--batch", type=int, default=1, help="size of dynamic dimensions (default 1)")
    parser.add_argument("--binary", action="store_true", help="binary tensor data instead of JSON")
    parser.add_argument("--token", help="bearer token (or set EDGE_RUNTIME_TOKEN)")
    args = parser.parse_args(argv)
    summary = asyncio.run(run_load(args.url.rstrip("/"), args.model, concurrency=args.concurrency, rate=args.rate,
                                   duration_s=args.duration_s, max_requests=args.max_requests, batch=args.batch,
                                   binary=args.binary, token=args.token or os.environ.get("EDGE_RUNTIME_TOKEN"),
                                   max_in_flight=args.max_in_flight))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
