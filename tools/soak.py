"""Soak: a bounded run of mixed traffic against a real ``edge-runtime serve``; reports leaks and drift.

Starts ``python -m edge_runtime serve`` on 127.0.0.1 (a free port) over a
repository built here (``mlp``, ``mobilenet`` from the model zoo, cpu backend;
``chat``, the torch-free tiny decoder of ``decoder_zoo``) and keeps closed-loop
clients of every kind busy for ``--seconds`` (and at most ``MAX_PER_CLIENT``
requests each):

* ``infer_json``     JSON tensors to ``mlp``;
* ``infer_binary``   binary tensors in and out to ``mobilenet``;
* ``infer_shm``      ``mlp`` through system shared memory: the client owns a POSIX shm object, registers
                     an input and an output region of it, writes the input there, reads the answer from
                     there; it unregisters and registers again every ``SHM_REREGISTER`` requests;
* ``async_task``     ``Prefer: respond-async`` to ``mlp``, then poll the task, fetch its result, delete it;
* ``chat_stream``    ``/v1/chat/completions`` with ``stream: true`` (greedy, with the usage chunk) to
                     ``chat``, a small prefix cache that keeps evicting;
* ``bad_request``    malformed and wrong-shape bodies, to ``/infer`` and ``/v1/chat/completions``: a 4xx
                     naming the problem is the expected answer;
* ``metadata``       model metadata, readiness, statistics, ``/v1/models`` and ``/metrics``;
* ``overload``       (``--overload``) bursts of ``OVERLOAD_BURST`` binary requests at once to ``burst`` (the
                     mobilenet with a queue of ``BURST_QUEUE``), 1 to 4 rows each (its dynamic batch dim: every
                     size a new input shape), far more than its queue holds: a 200 with the right rows or a
                     429 with ``Retry-After`` is the expected answer.

Models are served on their default configuration (no ``[serving] backend``: the
daemon's ``auto`` chooses); ``--backend cpu`` pins them, for a comparison.

Every answer is checked (tensors against ONNX Runtime in this process, greedy
text against the decoder loaded in this process); anything unexpected is
counted by kind and status. The daemon's RSS is sampled every
second. Prints one JSON object and writes ``soak.json`` and ``soak.png`` to
``--out``: requests per kind, unexpected answers, wrong values, RSS start/end/peak
and growth over the second half, p50/p99 per window and the drift (last window's
p50 over the first's), and the chat model's token and prefix-cache counters.
Exits 1 when anything was unexpected or the daemon died.

    python tools/soak.py --seconds 180 --out bench-results
    python tools/soak.py --quick          # 20 s
    python tools/soak.py --seconds 60 --overload --backend cpu
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tools"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

WINDOWS = 6
CLIENTS = {"infer_json": 2, "infer_binary": 2, "infer_shm": 1, "async_task": 1, "chat_stream": 2, "bad_request": 1,
           "metadata": 1}
MAX_PER_CLIENT = 200_000  # a bound on count as well as on time
OVERLOAD_BURST = 96
BURST_QUEUE = 8
SHM_BYTES = 1 << 16
SHM_OUTPUT_OFFSET = 1 << 15
SHM_REREGISTER = 50
CHAT_PROMPTS = ["open the settings menu", "scroll down to the bottom", "tap the blue button twice",
                "search for the weather", "go back to the home screen", "type hello and send it"]
CHAT_TOKENS = 32
CHAT_CONFIG = "[generation]\nmax_batch_size = 4\nmax_queue = 16\nmax_seq_len = 256\nprefix_cache_bytes = 32768\n"


@dataclass
class Tally:
    """What the clients saw, by kind; latencies as (seconds since start, seconds taken)."""

    started: float = field(default_factory=time.monotonic)
    requests: Counter = field(default_factory=Counter)
    unexpected: Counter = field(default_factory=Counter)  # "kind:status"
    wrong: Counter = field(default_factory=Counter)
    latencies: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    examples: list[str] = field(default_factory=list)

    def record(self, kind: str, began: float, ok: bool, what: str = "") -> None:
        self.requests[kind] += 1
        if ok:
            self.latencies[kind].append((began - self.started, time.monotonic() - began))
        else:
            self.unexpected[f"{kind}:{what}"] += 1
            if len(self.examples) < 10:
                self.examples.append(f"{kind}: {what}")


def build_repository(root: Path, backend: str = "auto", overload: bool = False) -> dict[str, Any]:
    """mlp/1 and mobilenet/1 (``backend`` pinned unless ``auto``), chat/1 the tiny decoder, burst/1 with
    ``overload``; returns inputs and their ONNX Runtime outputs, the mlp's output name, and each chat
    prompt's greedy answer (the decoder run in this process)."""
    import onnx
    import onnxruntime as ort

    from edge_runtime.decoder_zoo import DecoderShape, write_decoder_folder
    from edge_runtime.generation.model import load_generative
    from edge_runtime.model_zoo import build_mlp, build_mobilenet

    cases: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    for name, model, shape in (("mlp", build_mlp(seed=0), (2, 64)), ("mobilenet", build_mobilenet(), (1, 3, 64, 64))):
        path = root / name / "1" / "model.onnx"
        path.parent.mkdir(parents=True)
        onnx.save(model, str(path))
        (root / name / "config.toml").write_text(f'[serving]\nbackend = "{backend}"\n' if backend != "auto" else "")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = [{"input": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]
        cases[name] = [(f, session.run(None, f)[0]) for f in feeds]
        cases[f"{name}_output"] = session.get_outputs()[0].name
    burst = root / "burst" / "1"
    if overload:
        burst.mkdir(parents=True)
        (burst / "model.onnx").write_bytes((root / "mobilenet" / "1" / "model.onnx").read_bytes())
        (root / "burst" / "config.toml").write_text((root / "mobilenet" / "config.toml").read_text() +
                                                    f"[queue]\nmax_queue_size = {BURST_QUEUE}\n")
    folder = write_decoder_folder(root / "chat" / "1", DecoderShape(hidden=64, intermediate=128, vocab=600,
                                                                    max_positions=256), seed=1)
    (root / "chat" / "config.toml").write_text(CHAT_CONFIG)
    decoder = load_generative(folder, "chat", threads=1)
    try:
        cases["chat"] = {p: decoder.generate(messages=_messages(p), max_tokens=CHAT_TOKENS) for p in CHAT_PROMPTS}
    finally:
        decoder.close()
    return cases


def _messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are a phone agent."}, {"role": "user", "content": prompt}]


async def client(kind: str, k: int, url: str, cases: dict[str, Any], tally: Tally, stop_at: float) -> None:
    import aiohttp

    from edge_runtime.protocol import codec

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        state = await _SETUP[kind](session, url, k) if kind in _SETUP else None
        try:
            for i in range(k + 1, k + 1 + MAX_PER_CLIENT):
                if time.monotonic() >= stop_at:
                    break
                began = time.monotonic()
                try:
                    ok, what = await _ONE[kind](session, url, cases, i, codec, state)
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    ok, what = False, f"transport {type(exc).__name__}"
                except AssertionError as exc:
                    ok, what = False, f"wrong: {exc}"
                    tally.wrong[kind] += 1
                tally.record(kind, began, ok, what)
        finally:
            if kind in _TEARDOWN:
                await _TEARDOWN[kind](session, url, state)


async def _infer_json(session: Any, url: str, cases: dict, i: int, codec: Any, state: Any) -> tuple[bool, str]:
    feeds, want = cases["mlp"][i % len(cases["mlp"])]
    async with session.post(f"{url}/v2/models/mlp/infer", data=codec.encode_request(feeds).body) as response:
        if response.status != 200:
            return False, str(response.status)
        (output,) = (await response.json())["outputs"]
    got = np.array(output["data"], np.float32).reshape(output["shape"])
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5), "infer_json values differ from ONNX Runtime"
    return True, ""


async def _infer_binary(session: Any, url: str, cases: dict, i: int, codec: Any, state: Any) -> tuple[bool, str]:
    feeds, want = cases["mobilenet"][i % len(cases["mobilenet"])]
    encoded = codec.encode_request(feeds, binary=True, parameters={"binary_data_output": True})
    async with session.post(f"{url}/v2/models/mobilenet/infer", data=encoded.body,
                            headers={"Inference-Header-Content-Length": str(encoded.header_length)}) as response:
        body = await response.read()
        if response.status != 200:
            return False, str(response.status)
        length = int(response.headers["Inference-Header-Content-Length"])
    got = np.frombuffer(body[length:], "<f4").reshape(want.shape)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5), "infer_binary values differ from ONNX Runtime"
    return True, ""


async def _async_task(session: Any, url: str, cases: dict, i: int, codec: Any, state: Any) -> tuple[bool, str]:
    feeds, want = cases["mlp"][i % len(cases["mlp"])]
    async with session.post(f"{url}/v2/models/mlp/infer", data=codec.encode_request(feeds).body,
                            headers={"Prefer": "respond-async"}) as response:
        if response.status != 202:
            return False, f"submit {response.status}"
        task = await response.json()
    for _ in range(2000):  # bounded poll
        async with session.get(f"{url}/v2/tasks/{task['id']}") as response:
            status = (await response.json())["status"]
        if status != "pending":
            break
        await asyncio.sleep(0.005)
    async with session.get(f"{url}/v2/tasks/{task['id']}/result") as response:
        if response.status != 200:
            return False, f"result {response.status}"
        (output,) = (await response.json())["outputs"]
    async with session.delete(f"{url}/v2/tasks/{task['id']}") as response:
        if response.status != 200:
            return False, f"delete {response.status}"
    got = np.array(output["data"], np.float32).reshape(output["shape"])
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5), "async_task values differ from ONNX Runtime"
    return True, ""


BAD_BODIES = (b"{", b'{"inputs": []}', b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,63],"data":[]}]}',
              b'{"inputs":[{"name":"input","datatype":"INT8","shape":[1,64],"data":' + b"[1.5]" + b"}]}",
              b"[" * 100_000)
BAD_CHATS = (b"{", b'{"model": "chat"}', b'{"model": "chat", "messages": []}',
             b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}',
             b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}',
             b'{"model": "nope", "messages": [{"role": "user", "content": "hi"}]}')


async def _bad_request(session: Any, url: str, cases: dict, i: int, codec: Any, state: Any) -> tuple[bool, str]:
    path, bodies = ("/v1/chat/completions", BAD_CHATS) if i % 3 == 0 else ("/v2/models/mlp/infer", BAD_BODIES)
    async with session.post(f"{url}{path}", data=bodies[i % len(bodies)]) as response:
        document = await response.json(content_type=None)
        named = isinstance(document, dict) and bool(document.get("error"))
        return (400 <= response.status < 500 and named), f"{response.status}{'' if named else ' unnamed'}"


async def _metadata(session: Any, url: str, cases: dict, i: int, codec: Any, state: Any) -> tuple[bool, str]:
    path = ("/v2/models/mobilenet", "/v2/health/ready", "/v2/models/mlp/stats", "/v1/models", "/metrics")[i % 5]
    async with session.get(f"{url}{path}") as response:
        await response.read()
        return response.status == 200, f"{path} {response.status}"


@dataclass
class ShmClient:
    """One client's POSIX shm object (``/dev/shm/<name>``) and its two registered regions."""

    name: str
    fd: int
    registered: bool = False

    @property
    def input_region(self) -> str:
        return f"{self.name}-in"

    @property
    def output_region(self) -> str:
        return f"{self.name}-out"


async def _shm_register(session: Any, url: str, shm: ShmClient) -> None:
    for region, offset, size in ((shm.input_region, 0, SHM_OUTPUT_OFFSET),
                                 (shm.output_region, SHM_OUTPUT_OFFSET, SHM_BYTES - SHM_OUTPUT_OFFSET)):
        async with session.post(f"{url}/v2/systemsharedmemory/region/{region}/register",
                                json={"key": f"/{shm.name}", "offset": offset, "byte_size": size}) as response:
            assert response.status == 200, f"register {region}: {response.status} {await response.text()}"
    shm.registered = True


async def _shm_unregister(session: Any, url: str, shm: ShmClient) -> None:
    for region in (shm.input_region, shm.output_region):
        async with session.post(f"{url}/v2/systemsharedmemory/region/{region}/unregister") as response:
            assert response.status == 200, f"unregister {region}: {response.status} {await response.text()}"
    shm.registered = False


async def _shm_setup(session: Any, url: str, k: int) -> ShmClient:
    name = f"soak-{os.getpid()}-{k}"
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, SHM_BYTES)
    return ShmClient(name, fd)


async def _shm_teardown(session: Any, url: str, shm: ShmClient) -> None:
    try:
        if shm.registered:
            await _shm_unregister(session, url, shm)
    finally:
        os.close(shm.fd)
        os.unlink(f"/dev/shm/{shm.name}")


async def _infer_shm(session: Any, url: str, cases: dict, i: int, codec: Any, shm: ShmClient) -> tuple[bool, str]:
    if i % SHM_REREGISTER == 0 and shm.registered:  # the region lifecycle, not only the reads
        await _shm_unregister(session, url, shm)
    if not shm.registered:
        await _shm_register(session, url, shm)
    feeds, want = cases["mlp"][i % len(cases["mlp"])]
    x = feeds["input"]
    os.pwrite(shm.fd, x.tobytes(), 0)
    document = {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                            "parameters": {"shared_memory_region": shm.input_region,
                                           "shared_memory_byte_size": x.nbytes}}],
                "outputs": [{"name": cases["mlp_output"],
                             "parameters": {"shared_memory_region": shm.output_region,
                                            "shared_memory_byte_size": want.nbytes}}]}
    async with session.post(f"{url}/v2/models/mlp/infer", json=document) as response:
        if response.status != 200:
            return False, f"{response.status} {(await response.text())[:120]}"
        (output,) = (await response.json())["outputs"]
    assert output["parameters"]["shared_memory_region"] == shm.output_region, output
    got = np.frombuffer(os.pread(shm.fd, want.nbytes, SHM_OUTPUT_OFFSET), "<f4").reshape(want.shape)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5), "infer_shm values differ from ONNX Runtime"
    return True, ""


async def _chat_stream(session: Any, url: str, cases: dict, i: int, codec: Any, state: Any) -> tuple[bool, str]:
    prompt = CHAT_PROMPTS[i % len(CHAT_PROMPTS)]
    body = {"model": "chat", "messages": _messages(prompt), "max_tokens": CHAT_TOKENS, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        if response.status != 200:
            return False, f"{response.status} {(await response.text())[:120]}"
        raw = await response.read()
    *blocks, rest = raw.split(b"\n\n")
    assert not rest.strip(), f"chat_stream: a chunk cut in half: {rest[:80]!r}"
    payloads = [block.removeprefix(b"data: ") for block in blocks]
    assert payloads and payloads[-1] == b"[DONE]", "chat_stream: no [DONE]"
    events = [json.loads(p) for p in payloads[:-1]]
    text = "".join((c.get("delta") or {}).get("content") or "" for e in events for c in e["choices"])
    want = cases["chat"][prompt]
    assert text == want.text, f"chat_stream text differs from the decoder in process for {prompt!r}"
    assert events[-1]["usage"]["completion_tokens"] == want.usage.completion_tokens, "chat_stream usage"
    return True, ""


async def _overload(session: Any, url: str, cases: dict, i: int, codec: Any, state: Any) -> tuple[bool, str]:
    """One burst; ok when every answer is a 200 with ONNX Runtime's rows or a 429 with Retry-After."""
    singles = cases["mobilenet"]

    async def one(j: int) -> str:
        rows = 1 + (i + j) % 4
        picked = [singles[(i + j + r) % len(singles)] for r in range(rows)]
        x = np.concatenate([f["input"] for f, _ in picked])
        want = np.concatenate([w for _, w in picked])
        encoded = codec.encode_request({"input": x}, binary=True, parameters={"binary_data_output": True})
        async with session.post(f"{url}/v2/models/burst/infer", data=encoded.body,
                                headers={"Inference-Header-Content-Length": str(encoded.header_length)}) as response:
            body = await response.read()
            if response.status == 429:
                return "" if "Retry-After" in response.headers else "429 without Retry-After"
            if response.status != 200:
                return str(response.status)
            length = int(response.headers["Inference-Header-Content-Length"])
        got = np.frombuffer(body[length:], "<f4").reshape(want.shape)
        assert np.allclose(got, want, rtol=1e-4, atol=1e-5), "overload values differ from ONNX Runtime"
        return ""

    problems = [p for p in await asyncio.gather(*(one(j) for j in range(OVERLOAD_BURST))) if p]
    return not problems, problems[0] if problems else ""


_ONE = {"infer_json": _infer_json, "infer_binary": _infer_binary, "infer_shm": _infer_shm, "async_task": _async_task,
        "chat_stream": _chat_stream, "bad_request": _bad_request, "metadata": _metadata, "overload": _overload}
_SETUP = {"infer_shm": _shm_setup}
_TEARDOWN = {"infer_shm": _shm_teardown}


async def sample_rss(pid: int, samples: list[tuple[float, int]], started: float, stop_at: float) -> None:
    import psutil

    process = psutil.Process(pid)
    while time.monotonic() < stop_at:
        samples.append((time.monotonic() - started, process.memory_info().rss))
        await asyncio.sleep(1.0)


def summarise(tally: Tally, rss: list[tuple[float, int]], seconds: float, alive: bool) -> dict[str, Any]:
    windows: dict[str, list[dict[str, float]]] = {}
    for kind, values in sorted(tally.latencies.items()):
        rows = []
        for w in range(WINDOWS):
            low, high = seconds * w / WINDOWS, seconds * (w + 1) / WINDOWS
            taken = np.array([t for at, t in values if low <= at < high] or [np.nan]) * 1e3
            rows.append({"p50_ms": round(float(np.nanpercentile(taken, 50)), 2),
                         "p99_ms": round(float(np.nanpercentile(taken, 99)), 2), "n": int(np.sum(~np.isnan(taken)))})
        windows[kind] = rows
    values = [r for _, r in rss]
    half = [r for at, r in rss if at >= seconds / 2] or values
    return {
        "seconds": seconds, "daemon_alive": alive, "kinds": len(tally.requests),
        "requests": dict(sorted(tally.requests.items())), "requests_total": sum(tally.requests.values()),
        "unexpected": dict(sorted(tally.unexpected.items())), "wrong_values": dict(tally.wrong),
        "examples": tally.examples,
        "rss_mib": {"start": round(values[0] / 2**20, 1), "end": round(values[-1] / 2**20, 1),
                    "peak": round(max(values) / 2**20, 1),
                    "growth_second_half": round((half[-1] - half[0]) / 2**20, 1)} if values else {},
        "latency_windows": windows,
        "drift_p50": {k: round(rows[-1]["p50_ms"] / rows[0]["p50_ms"], 2) if rows[0]["p50_ms"] else None
                      for k, rows in windows.items()},
    }


def plot(result: dict[str, Any], rss: list[tuple[float, int]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot([t for t, _ in rss], [r / 2**20 for _, r in rss])
    left.set(title="daemon RSS", xlabel="s", ylabel="MiB")
    centres = [(w + 0.5) * result["seconds"] / WINDOWS for w in range(WINDOWS)]
    for kind, rows in result["latency_windows"].items():
        right.plot(centres, [r["p50_ms"] for r in rows], marker="o", label=kind)
    right.set(title="p50 latency per window", xlabel="s", ylabel="ms", yscale="log")
    right.legend(fontsize=8)
    figure.suptitle(f"soak: {result['requests_total']} requests of {result['kinds']} kinds, "
                    f"{sum(result['unexpected'].values())} unexpected")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)


async def soak(seconds: float, work: Path, backend: str = "auto",
               overload: bool = False) -> tuple[dict[str, Any], list[tuple[float, int]]]:
    from cloud_peer import free_port

    from urllib.request import urlopen

    cases = build_repository(work / "repository", backend, overload)
    clients = {**CLIENTS, **({"overload": 1} if overload else {})}
    port = free_port()
    env = {**os.environ, "EDGE_RUNTIME_CACHE": str(work / "cache"), "PYTHONPATH": str(ROOT),
           "EDGE_RUNTIME_THREADS": "1"}
    with open(work / "serve.log", "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "edge_runtime", "serve", "--port", str(port),
                                    "--model-repository", str(work / "repository")],
                                   cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                with urlopen(f"{url}/v2/health/ready", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        else:
            raise SystemExit(f"soak: the daemon did not become ready: {(work / 'serve.log').read_text()[-2000:]}")
        tally, rss = Tally(), []
        stop_at = tally.started + seconds
        await asyncio.gather(sample_rss(process.pid, rss, tally.started, stop_at),
                             *(client(kind, k, url, cases, tally, stop_at)
                               for kind, n in clients.items() for k in range(n)))
        alive = process.poll() is None
        generation = _generation_figures(url) if alive else {}
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
    result = summarise(tally, rss, seconds, alive)
    result["backend"], result["overload"] = backend, overload
    result["generation"] = generation
    result["exit_code"] = process.returncode
    return result, rss


def _generation_figures(url: str) -> dict[str, float]:
    """The chat model's counters from ``/metrics``: tokens, prefix cache lookups, hits and evictions."""
    import re
    from urllib.request import urlopen

    with urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    figures = {}
    for name, metric in (("decode_tokens", r'generation_tokens_total\{kind="decode",model="chat"\}'),
                         ("prefill_tokens", r'generation_tokens_total\{kind="prefill",model="chat"\}'),
                         ("prefix_cache_lookups", r'prefix_cache_lookups_total\{model="chat"\}'),
                         ("prefix_cache_hits", r'prefix_cache_hits_total\{model="chat"\}'),
                         ("prefix_cache_evicted_blocks", r'prefix_cache_evicted_blocks_total\{model="chat"\}')):
        match = re.search(r"^edge_runtime_" + metric + r" (\S+)", text, re.MULTILINE)
        figures[name] = float(match.group(1)) if match else None
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long to keep the traffic up")
    parser.add_argument("--quick", action="store_true", help="20 s")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--backend", default="auto",
                        help="[serving] backend of the tensor models (default auto: their default configuration)")
    parser.add_argument("--overload", action="store_true", help="add the overload client (bursts beyond the queue)")
    args = parser.parse_args(argv)
    seconds = 20.0 if args.quick else args.seconds
    with tempfile.TemporaryDirectory(prefix="soak-") as work:
        result, rss = asyncio.run(soak(seconds, Path(work), args.backend, args.overload))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(result, indent=1))
    plot(result, rss, args.out / "soak.png")
    print(json.dumps(result, indent=1))
    bad = result["unexpected"] or result["wrong_values"] or not result["daemon_alive"] or result["exit_code"] != 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
