"""Benchmark: start-up and memory — import time, cold vs warm loads, daemon RSS, warm-up, int8 vs fp32.

Each figure is compared with what a user would do instead, in the same run:

* ``import``: ``import edge_runtime`` (and building a ``Runtime``, which probes
  the device) vs ``import onnxruntime``; fresh interpreters, interleaved, best of rounds.
* ``load``: a model's load + first run in a fresh process with an empty cache
  (cold) and again with the cache the cold run left (warm), per backend, vs
  ``onnxruntime.InferenceSession`` in a fresh process; interleaved, best of rounds.
  Imports and the device probe are excluded on both sides (they are ``import``).
  OpenCL's cold runs also get an empty PoCL kernel cache.
* ``rss``: ``edge-runtime serve`` resident set with 0 and N models loaded vs a
  process holding N plain ``InferenceSession``s of the same files.
* ``warmup``: request latency over HTTP, first vs tenth, with ``[warmup]`` on
  and off (fresh caches each, interleaved, best of rounds), end to end and the
  server's own part (queue + compute, from the response's parameters).
* ``int8``: ``quantize --mode static`` on CNNs (the model zoo's MobileNet-style
  CNN at 160 px, its ResNet-style CNN of dense 3x3 convolutions at 112 px, PP-OCR's
  direction classifier when rapidocr-onnxruntime is installed): fp32 vs int8
  latency on the ``cpu`` plan (interleaved, best of rounds, non-spinning sessions)
  and top-1 agreement on the calibration set (seeded inputs).

Prints one JSON object and writes ``startup.json`` and ``startup.png`` under ``--out``.
Usage: ``python tools/bench_startup.py --out bench_out/startup [--quick]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "EDGE_RUNTIME_THREADS": os.environ.get("EDGE_RUNTIME_THREADS", "2")}

IMPORT_CODE = {
    "import edge_runtime": "import edge_runtime",
    "edge_runtime Runtime()": "from edge_runtime.runtime import Runtime; Runtime()",
    "import onnxruntime": "import onnxruntime",
}

LOAD_CODE = """
import json, sys, time
import numpy as np
kind, model, backend = sys.argv[1], sys.argv[2], sys.argv[3]
shape = json.loads(sys.argv[4])
# Imports and the device probe are the 'import' figure: both sides start timing after them.
if kind == "plain":
    import onnxruntime as ort
    started = time.perf_counter()
    options = ort.SessionOptions(); options.intra_op_num_threads = 2
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    loaded = time.perf_counter()
    session.run(None, {name: np.zeros(shape, np.float32)})
else:
    import onnx, onnxruntime
    from edge_runtime.runtime import Runtime
    runtime = Runtime()
    runtime.backend(backend)  # built (and its driver checked) before timing
    started = time.perf_counter()
    m = runtime.load(model, backend=backend)
    loaded = time.perf_counter()
    m.run({m.inputs[0].name: np.zeros(shape, np.float32)})
done = time.perf_counter()
print(json.dumps({"load_s": loaded - started, "first_run_s": done - loaded, "total_s": done - started}))
"""

def _child(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                            env=env or ENV, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"child failed: {result.stderr[-2000:]}")
    return result.stdout.strip().splitlines()[-1]


def bench_import(rounds: int) -> dict[str, Any]:
    best = {name: float("inf") for name in IMPORT_CODE}
    for _ in range(rounds):
        for name, code in IMPORT_CODE.items():
            timed = f"import time; t = time.perf_counter(); {code}; print(time.perf_counter() - t)"
            best[name] = min(best[name], float(_child(timed)))
    return {name: round(value * 1e3, 1) for name, value in best.items()} | {
        "ratio_import_vs_onnxruntime": round(best["import edge_runtime"] / best["import onnxruntime"], 3)}


def bench_load(models: dict[str, tuple[Path, list[int]]], backends: list[str], rounds: int) -> list[dict[str, Any]]:
    rows = []
    for label, (path, shape) in models.items():
        for backend in backends:
            if backend == "opencl" and label != "mobilenet64":
                continue  # PoCL compiles every kernel per shape: one model keeps the run short
            best = {"cold": float("inf"), "warm": float("inf"), "plain": float("inf")}
            for _ in range(rounds):
                with tempfile.TemporaryDirectory() as cache:
                    env = {**ENV, "EDGE_RUNTIME_CACHE": cache, "POCL_CACHE_DIR": str(Path(cache) / "pocl")}
                    args = ("ours", str(path), backend, json.dumps(shape))
                    best["cold"] = min(best["cold"], json.loads(_child(LOAD_CODE, *args, env=env))["total_s"])
                    best["warm"] = min(best["warm"], json.loads(_child(LOAD_CODE, *args, env=env))["total_s"])
                    plain = json.loads(_child(LOAD_CODE, "plain", str(path), "cpu", json.dumps(shape), env=env))
                    best["plain"] = min(best["plain"], plain["total_s"])
            rows.append({"model": label, "backend": backend, "cold_ms": round(best["cold"] * 1e3, 1),
                         "warm_ms": round(best["warm"] * 1e3, 1), "plain_ort_ms": round(best["plain"] * 1e3, 1),
                         "cold_over_warm": round(best["cold"] / best["warm"], 2),
                         "warm_over_plain_ort": round(best["warm"] / best["plain"], 2)})
    return rows


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """``edge-runtime serve`` in a child process, on a free loopback port; stopped by its PID."""

    def __init__(self, repository: Path, cache: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "edge_runtime", "serve", "--port", str(self.port), "--model-repository",
             str(repository)], env={**ENV, "EDGE_RUNTIME_CACHE": cache}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)

    def wait_ready(self, timeout_s: float = 300) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("the daemon exited")
            try:
                with urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the daemon did not become ready")

    def rss_bytes(self) -> int:
        import psutil

        return psutil.Process(self.process.pid).memory_info().rss

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _repository(root: Path, models: dict[str, Path], config: str = '[serving]\nbackend = "cpu"\n') -> Path:
    import shutil

    for name, path in models.items():
        (root / name / "1").mkdir(parents=True)
        shutil.copy(path, root / name / "1" / "model.onnx")
        (root / name / "config.toml").write_text(config)
    return root


PLAIN_RSS_CODE = """
import sys, time, psutil, onnxruntime as ort
options = ort.SessionOptions(); options.intra_op_num_threads = 2
sessions = [ort.InferenceSession(p, options, providers=["CPUExecutionProvider"]) for p in sys.argv[1:]]
print(psutil.Process().memory_info().rss)
"""


def bench_rss(model_files: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for n in sorted({0, 1, len(model_files)}):
        with tempfile.TemporaryDirectory() as tmp:
            repo = _repository(Path(tmp) / "repo", {f"m{i}": p for i, p in enumerate(model_files[:n])})
            if n == 0:
                repo.mkdir(parents=True, exist_ok=True)
            daemon = Daemon(repo, str(Path(tmp) / "cache"))
            try:
                daemon.wait_ready()
                time.sleep(1.0)  # let start-up allocations settle before reading the RSS
                ours = daemon.rss_bytes()
            finally:
                daemon.stop()
            plain = int(_child(PLAIN_RSS_CODE, *[str(p) for p in model_files[:n]]))
            rows.append({"models": n, "daemon_rss_mb": round(ours / 2**20, 1), "plain_ort_rss_mb": round(plain / 2**20, 1)})
    return rows


def bench_warmup(model: Path, shape: list[int], backend: str, rounds: int, requests: int = 10) -> list[dict[str, Any]]:
    """First vs ``requests``-th request of a fresh daemon, with ``[warmup]`` off and on, interleaved.

    Best of ``rounds`` daemons each (fresh caches every time). Also the server's own part of each
    request (the response's ``queue_us`` + ``compute_us``), which is what warm-up is for: the rest is
    the daemon's first HTTP request through Python, the same with warm-up or without.
    """
    import urllib.request

    import numpy as np

    from edge_runtime.protocol import codec

    body = codec.encode_request({"input": np.zeros(shape, np.float32)}).body
    best: dict[bool, dict[str, float]] = {}
    for _ in range(rounds):
        for enabled in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                config = f'[warmup]\nenabled = {str(enabled).lower()}\n[serving]\nbackend = "{backend}"\n'
                repo = _repository(Path(tmp) / "repo", {"m": model}, config)
                daemon = Daemon(repo, str(Path(tmp) / "cache"))
                latencies, server = [], []
                try:
                    daemon.wait_ready()
                    for _ in range(requests):
                        request = urllib.request.Request(f"{daemon.url}/v2/models/m/infer", data=body, method="POST")
                        started = time.perf_counter()
                        with urllib.request.urlopen(request, timeout=300) as response:
                            answer = response.read()
                        latencies.append((time.perf_counter() - started) * 1e3)
                        parameters = json.loads(answer)["parameters"]
                        server.append((parameters["queue_us"] + parameters["compute_us"]) / 1e3)
                finally:
                    daemon.stop()
            seen = best.setdefault(enabled, {"first_ms": float("inf"), "tenth_ms": float("inf"),
                                             "server_first_ms": float("inf"), "server_tenth_ms": float("inf")})
            for key, value in (("first_ms", latencies[0]), ("tenth_ms", latencies[-1]),
                               ("server_first_ms", server[0]), ("server_tenth_ms", server[-1])):
                seen[key] = min(seen[key], value)
    return [{"backend": backend, "warmup": enabled, **{k: round(v, 2) for k, v in seen.items()},
             "first_over_tenth": round(seen["first_ms"] / seen["tenth_ms"], 2),
             "server_first_over_tenth": round(seen["server_first_ms"] / seen["server_tenth_ms"], 2),
             "rounds": rounds} for enabled, seen in best.items()]


def bench_int8(models: dict[str, Path], rounds: int, samples: int) -> list[dict[str, Any]]:
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.errors import EdgeRuntimeError
    from edge_runtime.optimize.workflow import convert
    from edge_runtime.runtime import Runtime

    rows = []
    runtime = Runtime(RuntimeConfig(intra_op_threads=2))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for label, path in models.items():
                try:
                    report = convert(runtime, path, Path(tmp) / f"{label}_int8.onnx", "static", plans=["cpu"],
                                     seeded_count=samples, rounds=rounds, runs_per_round=5).to_dict()
                except EdgeRuntimeError as exc:  # one model the quantizer refuses must not end the run
                    rows.append({"model": label, "error": str(exc), "speedup": 0.0})
                    continue
                drift, speed = report["accuracy"][0], report["speed"][0]
                rows.append({"model": label, "fp32_ms": speed["reference_ms"], "int8_ms": speed["candidate_ms"],
                             "speedup": speed["speedup"], "top1_agreement": drift["top1_agreement"],
                             "max_abs": drift["max_abs"], "samples": drift["rows"],
                             "size_ratio": report["size_ratio"], "settings": report["settings"]})
    finally:
        runtime.close()
    return rows


def _models(directory: Path, quick: bool) -> dict[str, tuple[Path, list[int]]]:
    import onnx

    from edge_runtime.model_zoo import build_mobilenet

    models = {}
    for label, size, width in (("mobilenet64", 64, 16), ("mobilenet160", 160, 32)):
        path = directory / f"{label}.onnx"
        onnx.save(build_mobilenet(image_size=size, width=width), str(path))
        models[label] = (path, [1, 3, size, size])
    try:
        import rapidocr_onnxruntime

        det = Path(rapidocr_onnxruntime.__file__).parent / "models" / "ch_PP-OCRv4_det_infer.onnx"
        models["ppocr_det"] = (det, [1, 3, 320 if quick else 640, 320 if quick else 640])
    except ImportError:
        pass
    return models


def _ppocr_cls(directory: Path) -> Path | None:
    """PP-OCR's direction classifier with its dynamic batch and width fixed (so seeded inputs fit)."""
    try:
        import rapidocr_onnxruntime
    except ImportError:
        return None
    import onnx

    model = onnx.load(str(Path(rapidocr_onnxruntime.__file__).parent / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"))
    for dim, value in zip(model.graph.input[0].type.tensor_type.shape.dim, (1, 3, 48, 192)):
        dim.dim_value = value
    path = directory / "ppocr_cls.onnx"
    onnx.save(model, str(path))
    return path


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    load = result["load"]
    labels = [f"{r['model']}\n{r['backend']}" for r in load]
    xs = range(len(load))
    for offset, key in ((-0.25, "cold_ms"), (0.0, "warm_ms"), (0.25, "plain_ort_ms")):
        axes[0].bar([x + offset for x in xs], [r[key] for r in load], width=0.25, label=key)
    axes[0].set_xticks(list(xs), labels, fontsize=7)
    axes[0].set_yscale("log")
    axes[0].set_title("load + first run (ms)")
    axes[0].legend(fontsize=7)
    rss = result["rss"]
    axes[1].plot([r["models"] for r in rss], [r["daemon_rss_mb"] for r in rss], "o-", label="edge-runtime serve")
    axes[1].plot([r["models"] for r in rss], [r["plain_ort_rss_mb"] for r in rss], "s-", label="plain ORT sessions")
    axes[1].set_title("RSS (MiB) vs models loaded")
    axes[1].legend(fontsize=7)
    warm = result["warmup"]
    warm_labels = [f"{r['backend']}\nwarmup={r['warmup']}" for r in warm]
    warm_xs = range(len(warm))
    axes[2].bar([x - 0.2 for x in warm_xs], [r["first_over_tenth"] for r in warm], width=0.4, label="end to end")
    axes[2].bar([x + 0.2 for x in warm_xs], [r["server_first_over_tenth"] for r in warm], width=0.4,
                label="server: queue + compute")
    axes[2].set_xticks(list(warm_xs), warm_labels, fontsize=7)
    axes[2].set_yscale("log")
    axes[2].axhline(1.0, color="grey", lw=0.8)
    axes[2].legend(fontsize=7)
    axes[2].set_title("first / tenth request latency")
    int8 = result["int8"]
    axes[3].bar([r["model"] for r in int8], [r["speedup"] for r in int8])
    axes[3].axhline(1.0, color="grey", lw=0.8)
    axes[3].set_title("int8 speed-up on cpu (fp32 / int8)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench_out/startup"))
    parser.add_argument("--quick", action="store_true", help="fewer rounds, fewer models (a few minutes)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--only", choices=("int8",), default=None, help="run one part only (int8: the quantization figures)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 3)
    args.out.mkdir(parents=True, exist_ok=True)
    from backends.opencl import OpenCLBackend

    opencl = OpenCLBackend().availability().ok
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        models = _models(directory, args.quick)
        small, shape = models["mobilenet64"]
        copies = []
        import onnx

        from edge_runtime.model_zoo import build_mobilenet

        for seed in range(2 if args.quick else 4):  # distinct weights: no sharing between the N models
            copy = directory / f"copy{seed}.onnx"
            onnx.save(build_mobilenet(image_size=160, width=32, seed=10 + seed), str(copy))
            copies.append(copy)
        from edge_runtime.model_zoo import build_resnet

        onnx.save(build_resnet(), str(directory / "resnet112.onnx"))
        int8_models = {"mobilenet160": models["mobilenet160"][0], "resnet112": directory / "resnet112.onnx"}
        cls = _ppocr_cls(directory)
        if cls is not None:
            int8_models["ppocr_cls"] = cls
        if args.only == "int8":
            result = {"int8": bench_int8(int8_models, rounds, 32 if args.quick else 64)}
            (args.out / "int8.json").write_text(json.dumps(result, indent=2))
            print(json.dumps(result, indent=2))
            return 0
        result = {
            "import_ms": bench_import(rounds + 1),
            "load": bench_load(models, ["cpu", *(["opencl"] if opencl else [])], rounds),
            "rss": bench_rss(copies),
            "warmup": [*bench_warmup(small, shape, "cpu", rounds),
                       *(bench_warmup(small, shape, "opencl", rounds) if opencl else [])],
            "int8": bench_int8(int8_models, rounds, 32 if args.quick else 64),
        }
    (args.out / "startup.json").write_text(json.dumps(result, indent=2))
    plot(result, args.out / "startup.png")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
