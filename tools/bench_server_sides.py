"""The sides and measuring tools of ``bench_server.py``: load loops, ORT loops, shared memory, RSS, the plot."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Mapping

import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"


def ocr_model(kind: str) -> Path:
    """A PP-OCR model file (``det``, ``cls``, ``rec``) from the rapidocr-onnxruntime wheel (not imported)."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("bench_server: pip install rapidocr-onnxruntime (it ships the PP-OCR models)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "models"
    found = [p for p in folder.glob("*.onnx") if f"_{kind}_" in p.name]
    if not found:
        raise SystemExit(f"bench_server: no PP-OCR {kind} model in {folder}")
    return found[0]


def request_body(name: str, array: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """A binary-tensor v2 request for one input, asking for binary outputs."""
    from edge_runtime.protocol.codec import encode_request

    encoded = encode_request({name: array}, binary=True, parameters={"binary_data_output": True})
    return encoded.body, {"Content-Type": encoded.content_type, HEADER_LENGTH: str(encoded.header_length)}


def _stats(latencies_ms: list[float], elapsed_s: float) -> dict[str, Any]:
    values = np.asarray(latencies_ms or [float("nan")])
    return {"n": len(latencies_ms), "rps": round(len(latencies_ms) / max(elapsed_s, 1e-9), 1),
            "p50_ms": round(float(np.percentile(values, 50)), 3), "p95_ms": round(float(np.percentile(values, 95)), 3),
            "mean_ms": round(float(np.mean(values)), 3)}


async def closed_loop(url: str, model: str, body: tuple[bytes, dict[str, str]], concurrency: int,
                      duration_s: float) -> dict[str, Any]:
    """``concurrency`` clients sending ``body`` back to back for ``duration_s``; the server's own
    ``queue_us``/``compute_us``/``batch_size`` parameters averaged when it reports them."""
    import aiohttp

    data, headers = body
    target = f"{url}/v2/models/{model}/infer"
    latencies: list[float] = []
    server: dict[str, list[float]] = {"queue": [], "compute": [], "batch_size": []}
    errors: dict[int, int] = {}
    stop_at = time.monotonic() + duration_s
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:
        async def client() -> None:
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                async with session.post(target, data=data, headers=headers) as response:
                    raw = await response.read()
                    if response.status != 200:
                        errors[response.status] = errors.get(response.status, 0) + 1
                        continue
                    latencies.append((time.perf_counter() - started) * 1e3)
                    header = raw[:int(response.headers.get(HEADER_LENGTH, len(raw)))]
                parameters = __import__("json").loads(header).get("parameters") or {}
                for key, name in (("queue", "queue_us"), ("compute", "compute_us"), ("batch_size", "batch_size")):
                    if name in parameters:
                        server[key].append(float(parameters[name]))

        started = time.monotonic()
        await __import__("asyncio").gather(*(client() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
    result = _stats(latencies, elapsed)
    result["errors"] = errors
    result["server_us"] = {k: round(float(np.mean(v)), 1) for k, v in server.items() if v} or None
    return result


def h2load_available() -> bool:
    return shutil.which("h2load") is not None


def h2load_loop(url: str, model: str, body: tuple[bytes, dict[str, str]], concurrency: int,
                duration_s: float) -> dict[str, Any]:
    """``concurrency`` HTTP/1.1 connections sending ``body`` back to back for ``duration_s`` with nghttp2's
    ``h2load`` (Debian ``nghttp2-client``): a client in C, which takes a small share of the cores the
    server shares with it, where the aiohttp clients of ``closed_loop`` take about as much CPU per
    request as the daemon's event loop (serving benchmarks use a C client: Triton's perf_analyzer, wrk)."""
    data, headers = body
    with tempfile.NamedTemporaryFile(prefix="h2load-body-", suffix=".bin") as handle:
        handle.write(data)
        handle.flush()
        command = ["h2load", "--h1", "-c", str(concurrency), "-t", "1", "-m", "1", "-D", f"{duration_s:g}",
                   "-d", handle.name, *[f"-H{name}: {value}" for name, value in headers.items()],
                   f"{url}/v2/models/{model}/infer"]
        out = subprocess.run(command, capture_output=True, text=True, timeout=duration_s + 60).stdout
    finished = re.search(r"finished in ([\d.]+)s, ([\d.]+) req/s", out)
    counts = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded", out)
    codes = re.search(r"status codes: (\d+) 2xx", out)
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)\b", out)
    if not (finished and counts and codes):
        raise RuntimeError(f"h2load printed no summary: {out[-1500:]}")
    seconds = float(finished.group(1))
    ok = int(codes.group(1))
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    return {"n": ok, "rps": round(ok / max(seconds, 1e-9), 1), "errors": int(counts.group(1)) - ok,
            "mean_ms": round(float(mean.group(1)) * scale[mean.group(2)], 3) if mean else None,
            "client": "h2load"}


def ort_loop(session: Any, feed: Mapping[str, np.ndarray], duration_s: float) -> dict[str, Any]:
    """Plain in-process ONNX Runtime, one request at a time (what a user would call instead)."""
    latencies: list[float] = []
    started = time.monotonic()
    _run_until(session, feed, started + duration_s, latencies)
    return _stats(latencies, time.monotonic() - started)


def _run_until(session: Any, feed: Mapping[str, np.ndarray], stop_at: float, latencies: list[float]) -> None:
    """Run ``feed`` back to back until ``stop_at`` (monotonic), each run's ms appended to ``latencies``."""
    while time.monotonic() < stop_at:
        begin = time.perf_counter()
        session.run(None, dict(feed))
        latencies.append((time.perf_counter() - begin) * 1e3)


def side_by_side_loop(sessions: list[Any], feed: Mapping[str, np.ndarray], duration_s: float) -> dict[str, Any]:
    """One Python thread per session, each running ``feed`` back to back (ONNX Runtime lets go of the
    GIL inside a run): with one-thread sessions, what an unbatched server running rows side by side
    could reach in this process, no HTTP."""
    latencies: list[list[float]] = [[] for _ in sessions]
    started = time.monotonic()
    threads = [threading.Thread(target=_run_until, args=(session, feed, started + duration_s, out))
               for session, out in zip(sessions, latencies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return _stats([value for out in latencies for value in out], time.monotonic() - started)


def shm_loop(url: str, model: str, array: np.ndarray, duration_s: float) -> dict[str, Any]:
    """c=1 through Triton's system shared memory with tritonclient: input and output in regions."""
    import tritonclient.http as triton
    import tritonclient.utils.shared_memory as shm

    client = triton.InferenceServerClient(url.removeprefix("http://"), network_timeout=120)
    metadata = client.get_model_metadata(model)
    out_name = metadata["outputs"][0]["name"]
    out_bytes = array.nbytes  # the detector's map is [1, 1, H, W]: smaller than the input
    key = f"bench-{uuid.uuid4().hex[:8]}"
    handles = [shm.create_shared_memory_region(f"{key}-in", f"/{key}-in", array.nbytes),
               shm.create_shared_memory_region(f"{key}-out", f"/{key}-out", out_bytes)]
    try:
        shm.set_shared_memory_region(handles[0], [array])
        client.register_system_shared_memory(f"{key}-in", f"/{key}-in", array.nbytes)
        client.register_system_shared_memory(f"{key}-out", f"/{key}-out", out_bytes)
        item = triton.InferInput(metadata["inputs"][0]["name"], list(array.shape), "FP32")
        item.set_shared_memory(f"{key}-in", array.nbytes)
        wanted = triton.InferRequestedOutput(out_name)
        wanted.set_shared_memory(f"{key}-out", out_bytes)
        latencies = []
        stop_at = time.monotonic() + duration_s
        started = time.monotonic()
        while time.monotonic() < stop_at:
            begin = time.perf_counter()
            client.infer(model, [item], outputs=[wanted])
            latencies.append((time.perf_counter() - begin) * 1e3)
        elapsed = time.monotonic() - started
        client.unregister_system_shared_memory()
    finally:
        for handle in handles:
            shm.destroy_shared_memory_region(handle)
        client.close()
    return _stats(latencies, elapsed)


def codec_phases_us(body: tuple[bytes, dict[str, str]], outputs: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Mean µs of decoding this request body and encoding these outputs (binary), timed in this process."""
    from edge_runtime.protocol.codec import decode_request, encode_response

    data, headers = body
    header_length = int(headers[HEADER_LENGTH])
    request = decode_request(data, header_length)
    timings = {}
    for name, call in (("decode", lambda: decode_request(data, header_length)),
                       ("encode", lambda: encode_response("m", "1", request, outputs, {"plan": "cpu"}))):
        repeats, started = 0, time.perf_counter()
        while repeats < 20 or time.perf_counter() - started < 0.2:
            call()
            repeats += 1
        timings[name] = round((time.perf_counter() - started) / repeats * 1e6, 1)
    return timings


class RssSampler:
    """Resident memory of one process: now, and the peak sampled every 50 ms while entered."""

    def __init__(self, pid: int) -> None:
        import psutil

        self._process = psutil.Process(pid)
        self.peak_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def rss_mib(self) -> float:
        return round(self._process.memory_info().rss / 2**20, 1)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_mib = max(self.peak_mib, self.rss_mib())
            self._stop.wait(0.05)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.5))
    names = [n for n in ("c16_edge", "c16_edge_unbatched", "c16_kserve", "c16_ort_best") if n in result]
    labels = {"c16_edge": "edge-runtime\n(batching)", "c16_edge_unbatched": "edge-runtime\n(unbatched)",
              "c16_kserve": "KServe\nModelServer", "c16_ort_best": "ORT in-process\none at a time"}
    left.bar([labels[n] for n in names], [result[n]["rps"] for n in names],
             color=["C0", "C4", "C1", "C2"][:len(names)])
    left.set_ylabel("requests/s, cls, concurrency 16")
    c1 = [("cls ORT", "c1_cls_ort_best"), ("cls HTTP", "c1_cls_edge"), ("det ORT", "c1_det_ort_best"),
          ("det shm", "c1_det_shm"), ("det HTTP", "c1_det_binary")]
    middle.bar([n for n, _ in c1], [result[k]["p50_ms"] for _, k in c1], color=["C2", "C0", "C2", "C0", "C3"])
    middle.set_yscale("log")
    middle.set_ylabel("p50 ms, concurrency 1 (log)")
    phases = ("decode", "queue", "compute", "encode", "transport")
    bottoms = np.zeros(len(result["phases_us"]))
    for phase in phases:
        values = np.array([entry.get(phase, 0.0) / 1e3 for entry in result["phases_us"].values()])
        right.bar(list(result["phases_us"]), values, bottom=bottoms, label=phase)
        bottoms += values
    right.set_ylabel("ms per request (mean), by phase")
    right.legend()
    figure.suptitle(f"edge-runtime daemon vs KServe and in-process ONNX Runtime (PP-OCR, {result['cores']} cores, "
                    f"best of {result['rounds']} interleaved rounds)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
