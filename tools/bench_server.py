"""Benchmark: the daemon against a KServe ``ModelServer`` and in-process ONNX Runtime, on real OCR models.

Workloads (PP-OCR models from the ``rapidocr-onnxruntime`` wheel, read as files):

* ``cls``: the text-direction classifier, input ``x`` FP32 ``[1, 3, 48, 192]``, served
  with ``[batching] max_batch_size = 16``;
* ``det``: the text detector at a screenshot-sized ``[1, 3, 640, 640]`` FP32 input (4.9 MB).

Both are served on their default configuration: no ``[serving] backend``, so the
daemon's ``auto`` chooses (``--backend cpu`` pins them, for a comparison), and no
``[warmup] shapes`` (their dims are dynamic: warm-up waits for the first request).
Every run starts from an empty cache (calibration and the plan race included).

Sides, measured in one run with the sides interleaved in every round and the
best of the rounds kept (this machine's speed drifts within a minute):

* c=16 throughput on ``cls``: edge-runtime (binary tensors, batching on) vs the
  KServe peer (``tools/kserve_peer.py``, run by ``--kserve-python``, binary
  tensors) vs plain in-process ORT answering one request at a time;
* c=1 p50 on ``cls`` (binary HTTP) and on ``det`` (shared memory through
  tritonclient, and binary HTTP beside it) vs in-process ORT's p50;
* in-process ORT runs twice per round, with its default (spinning) session and
  with spinning off; each ratio's baseline is the better of the two in this run;
* edge-runtime's RSS idle (models loaded, warmed up) and its peak under load; the peer's too.

Configurations of the ``cls`` daemon (one daemon each, all measured in every round):
``batched`` (the default: batching on, ``[scheduler] spin = "load"``), ``unbatched``
(``max_batch_size = 0``), ``batched_nospin`` (``spin = "never"``, what served sessions
did before the spin policy) and ``batched_threaded`` (``inline_max_ms = 0``: an idle model's
lone request goes to a worker thread too, as before ``scheduler/inline.py``; its c=1 p50 is
measured too) and ``unbatched_pool`` (unbatched with ``single_thread = "never"``: every run on
the pool session, none on the one-thread session of ``scheduler/single_thread.py``).
Per configuration: rows/s at c=16, its ratio to in-process
ORT one request at a time, the batching gain (batched over unbatched), and the daemon's
CPU share (CPU seconds per wall second from ``/proc/<pid>/stat``, 1.0 = one core) over a
few idle seconds after warm-up and during its c=16 side. In-process ORT is also timed
at its best batch (8 and 16 rows per run spinning, 16 without spinning): rows/s of the
ceiling a batching server could reach in this process; and on one-thread sessions (a row alone,
16 rows in one run, and one session per core side by side, one row each): ``one_thread``'s
``batching_ceiling`` is ORT's best batch over the side-by-side rows/s, the most batching could add
over an unbatched server that runs one-thread rows side by side, before any HTTP. ``spin`` gives
each cls daemon's
runs on its spinning session and on its quiet twin (``edge_runtime.spin`` metadata).

Where nghttp2's ``h2load`` is installed (Debian ``nghttp2-client``), every c=16 side on ``cls`` is
measured a second time with it (``c16_h2load_*``; ``configurations["h2load"]``): a client in C,
where the aiohttp client takes about as much CPU per request as the daemon's event loop, and
both share the same 2 cores as the daemon. The figures with the Python client stay beside them.

Per-phase breakdown of the daemon's time (mean per request): ``queue`` and
``compute`` from each response's parameters, ``decode``/``encode`` by timing the
same codec calls on the same bodies in this process, ``transport`` the rest
(client, HTTP, event loop). Prints JSON and writes ``bench_server.json`` and
``bench_server.png`` to ``--out``. About 6 minutes by default, ~1.5 with ``--quick``.

    python tools/bench_server.py --kserve-python /work/venvs/kserve/bin/python --out bench-results
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tools"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

from bench_report import publish  # noqa: E402
from bench_server_sides import (  # noqa: E402  (needs the path above)
    RssSampler,
    closed_loop,
    codec_phases_us,
    h2load_available,
    h2load_loop,
    ocr_model,
    ort_loop,
    plot,
    request_body,
    shm_loop,
    side_by_side_loop,
)
from cloud_peer import ServerProcess, free_port  # noqa: E402

CLS_SHAPE, DET_SHAPE = (1, 3, 48, 192), (1, 3, 640, 640)
CLS_CONFIG = '[batching]\nmax_batch_size = 16\nmax_queue_delay_us = 1000\n[queue]\nmax_queue_size = 256\n'
DET_CONFIG = ''
# The cls daemon's configurations besides the default ("batched"): the comparisons.
CLS_VARIANTS = {
    "unbatched": '[batching]\nmax_batch_size = 0\n[queue]\nmax_queue_size = 256\n',
    "batched_nospin": '[scheduler]\nspin = "never"\n' + CLS_CONFIG,
    "batched_threaded": '[scheduler]\ninline_max_ms = 0\n' + CLS_CONFIG,  # no run on the event loop
    # every run on the pool session (no one-thread session, scheduler/single_thread.py)
    "unbatched_pool": '[scheduler]\nsingle_thread = "never"\n'
                      '[batching]\nmax_batch_size = 0\n[queue]\nmax_queue_size = 256\n',
}
IDLE_CPU_S = 3.0


def build_repository(root: Path, backend: str = "auto") -> dict[str, Path]:
    """``only-cls/cls`` and ``only-det/det``; ``backend`` other than ``auto`` pins both."""
    pin = f'[serving]\nbackend = "{backend}"\n' if backend != "auto" else ""
    paths = {}
    variants = [(f"cls-{label}", "cls", text + pin) for label, text in CLS_VARIANTS.items()]
    for name, kind, config in (("cls", "cls", CLS_CONFIG + pin), ("det", "det", DET_CONFIG + pin), *variants):
        folder = root / f"only-{name}" / kind
        (folder / "1").mkdir(parents=True)
        target = folder / "1" / "model.onnx"
        target.write_bytes(ocr_model(kind).read_bytes())
        (folder / "config.toml").write_text(config)
        paths[name] = target
    return paths


class KServePeer:
    """``tools/kserve_peer.py`` in KServe's own Python, serving ``cls``."""

    def __init__(self, python: str, model: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "w")
        self.process = subprocess.Popen(
            [python, str(ROOT / "tools" / "kserve_peer.py"), "--model", str(model), "--name", "cls",
             "--port", str(self.port), "--grpc-port", str(free_port())],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "0"})
        self._wait_ready(90.0)

    def _wait_ready(self, timeout_s: float) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"kserve peer exited {self.process.returncode}; see {self._log.name}")
            try:
                with urllib.request.urlopen(f"{self.url}/v2/models/cls/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise SystemExit(f"kserve peer not ready in {timeout_s:.0f} s; see {self._log.name}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log.close()


def best(rounds: list[dict[str, Any]], key: str, metric: str, lower: bool) -> dict[str, Any]:
    """The round whose ``metric`` is best for side ``key``."""
    chosen = [r[key] for r in rounds if key in r]
    return (min if lower else max)(chosen, key=lambda entry: entry[metric])


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import onnxruntime as ort

    paths = build_repository(tmp / "repository", args.backend)  # only-cls/cls and only-det/det
    rng = np.random.default_rng(0)
    cls_x = rng.random(CLS_SHAPE, dtype=np.float32)
    det_x = rng.random(DET_SHAPE, dtype=np.float32)
    paths = {name: path for name, path in paths.items() if name in ("cls", "det")}  # variants: same files
    sessions = {name: ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                for name, path in paths.items()}
    # The same session without spinning pool threads: on a loaded box the faster of the two; the
    # baseline of every ratio is whichever of both settings did better in this run.
    quiet = ort.SessionOptions()
    quiet.add_session_config_entry("session.intra_op.allow_spinning", "0")
    calm = {name: ort.InferenceSession(str(path), quiet, providers=["CPUExecutionProvider"])
            for name, path in paths.items()}
    # One-thread sessions: a row's cost with no intra-op parallelism, alone and in a batch, and two
    # of them side by side — what batching can add over a server that runs one-thread rows side by side.
    single = ort.SessionOptions()
    single.intra_op_num_threads = 1
    singles = [ort.InferenceSession(str(paths["cls"]), single, providers=["CPUExecutionProvider"])
               for _ in range(max(1, os.cpu_count() or 1))]
    # Two daemons, one CPU model each: the cls daemon's RSS is "one CPU model" (the RSS goal's setting).
    # EDGE_RUNTIME_THREADS=0: every usable core, as the in-process session gets.
    env = {"EDGE_RUNTIME_CACHE": str(tmp / "cache"), "EDGE_RUNTIME_THREADS": "0"}
    edge = ServerProcess.start(tmp / "repository" / "only-cls", tmp / "edge.log", timeout_s=120, env=env)
    edge_det = ServerProcess.start(tmp / "repository" / "only-det", tmp / "edge-det.log", timeout_s=120, env=env)
    variants = {label: ServerProcess.start(tmp / "repository" / f"only-cls-{label}", tmp / f"edge-{label}.log",
                                           timeout_s=120, env=env) for label in CLS_VARIANTS}
    kserve = KServePeer(args.kserve_python, paths["cls"], tmp / "kserve.log") if args.kserve_python else None
    cls_body = request_body("x", cls_x)
    det_body = request_body("x", det_x)
    batches = {rows: np.repeat(cls_x, rows, axis=0) for rows in (8, 16)}
    warm = 1.0 if args.quick else 2.0
    daemons = {"batched": edge, **variants}
    use_h2load = h2load_available() and not args.no_h2load
    try:
        edge_rss, kserve_rss = RssSampler(edge.process.pid), RssSampler(kserve.process.pid) if kserve else None
        for url, model, body in ((edge.url, "cls", cls_body), (edge_det.url, "det", det_body),
                                 *((server.url, "cls", cls_body) for server in variants.values())):
            asyncio.run(closed_loop(url, model, body, 4 if model == "cls" else 1, warm))
        if kserve:
            asyncio.run(closed_loop(kserve.url, "cls", cls_body, 4, warm))
        idle = {"edge": edge_rss.rss_mib(), "kserve": kserve_rss.rss_mib() if kserve_rss else None}
        idle_cpu = idle_cpu_share({label: server.process.pid for label, server in daemons.items()}, IDLE_CPU_S)
        served = {name: served_on(server) for name, server in (("cls", edge), ("det", edge_det))}

        def c16(label: str) -> Any:
            server = daemons[label]
            return lambda: with_cpu_share(server.process.pid, lambda: asyncio.run(
                closed_loop(server.url, "cls", cls_body, 16, args.duration_s)))

        def c16_h2load(label: str) -> Any:
            server = daemons[label]
            return lambda: with_cpu_share(server.process.pid, lambda: h2load_loop(
                server.url, "cls", cls_body, 16, args.duration_s))

        rounds = []
        with contextlib.ExitStack() as samplers:
            for sampler in (edge_rss, kserve_rss):
                if sampler is not None:
                    samplers.enter_context(sampler)
            for index in range(args.rounds):
                sides: list[tuple[str, Any]] = [
                    ("c16_edge", c16("batched")),
                    ("c16_ort", lambda: ort_loop(sessions["cls"], {"x": cls_x}, args.duration_s)),
                    ("c16_edge_unbatched", c16("unbatched")),
                    ("c1_cls_edge", lambda: asyncio.run(closed_loop(edge.url, "cls", cls_body, 1, args.duration_s))),
                    ("c1_cls_ort", lambda: ort_loop(sessions["cls"], {"x": cls_x}, args.duration_s)),
                    ("ort_batch8", lambda: rows_per_s(ort_loop(sessions["cls"], {"x": batches[8]},
                                                               args.duration_s), 8)),
                    ("c16_edge_batched_nospin", c16("batched_nospin")),
                    ("c16_edge_batched_threaded", c16("batched_threaded")),
                    ("c16_edge_unbatched_pool", c16("unbatched_pool")),
                    ("c1_cls_edge_threaded", lambda: asyncio.run(closed_loop(
                        variants["batched_threaded"].url, "cls", cls_body, 1, args.duration_s))),
                    ("c1_det_shm", lambda: shm_loop(edge_det.url, "det", det_x, args.det_duration_s)),
                    ("c1_det_binary", lambda: asyncio.run(closed_loop(edge_det.url, "det", det_body, 1,
                                                                      args.det_duration_s))),
                    ("c1_det_ort", lambda: ort_loop(sessions["det"], {"x": det_x}, args.det_duration_s)),
                    ("c16_ort_nospin", lambda: ort_loop(calm["cls"], {"x": cls_x}, args.duration_s)),
                    ("ort_batch16", lambda: rows_per_s(ort_loop(sessions["cls"], {"x": batches[16]},
                                                                args.duration_s), 16)),
                    ("c1_cls_ort_nospin", lambda: ort_loop(calm["cls"], {"x": cls_x}, args.duration_s)),
                    ("ort_nospin_batch16", lambda: rows_per_s(ort_loop(calm["cls"], {"x": batches[16]},
                                                                       args.duration_s), 16)),
                    ("c1_det_ort_nospin", lambda: ort_loop(calm["det"], {"x": det_x}, args.det_duration_s)),
                    ("ort_1thread_batch1", lambda: rows_per_s(ort_loop(singles[0], {"x": cls_x},
                                                                       args.duration_s), 1)),
                    ("ort_1thread_batch16", lambda: rows_per_s(ort_loop(singles[0], {"x": batches[16]},
                                                                        args.duration_s), 16)),
                    ("ort_1thread_side_by_side", lambda: rows_per_s(side_by_side_loop(
                        singles, {"x": cls_x}, args.duration_s), 1)),
                ]
                if kserve:
                    sides.insert(1, ("c16_kserve", lambda: asyncio.run(
                        closed_loop(kserve.url, "cls", cls_body, 16, args.duration_s))))
                if use_h2load:  # each beside its aiohttp twin, so both see the same moment's machine
                    for label in daemons:
                        aiohttp_side = "c16_edge" if label == "batched" else f"c16_edge_{label}"
                        twin = [name for name, _ in sides].index(aiohttp_side)
                        sides.insert(twin + 1, (f"c16_h2load_{label}", c16_h2load(label)))
                    if kserve:
                        twin = [name for name, _ in sides].index("c16_kserve")
                        sides.insert(twin + 1, ("c16_h2load_kserve", lambda: h2load_loop(
                            kserve.url, "cls", cls_body, 16, args.duration_s)))
                shift = index % len(sides)  # a different side goes first in every round
                rounds.append({name: measure() for name, measure in sides[shift:] + sides[:shift]})
        peak = {"edge": edge_rss.peak_mib, "kserve": kserve_rss.peak_mib if kserve_rss else None}
        spin_after = {label: served_on(server).get("spin") for label, server in daemons.items()}
    finally:
        for server in (edge, edge_det, *variants.values()):
            server.stop()
        if kserve:
            kserve.stop()
    result = summarise(rounds, idle, peak, cls_body, det_body, sessions, cls_x, det_x, args.backend)
    result["served"] = served
    result["configurations"] = configurations(result, rounds, idle_cpu)
    result["spin"] = spin_after  # per cls daemon: runs on the spinning session / its quiet twin, cost curve
    result["acceptance_batching"] = batching_acceptance(result)
    if "h2load" in result["configurations"]:
        result["acceptance_batching_h2load"] = batching_acceptance(result, result["configurations"]["h2load"])
    return result


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, every thread (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def idle_cpu_share(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """CPU seconds per wall second of each process over ``seconds`` of no requests (1.0 = one core)."""
    before, started = {label: cpu_seconds(pid) for label, pid in pids.items()}, time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - started
    return {label: round((cpu_seconds(pid) - before[label]) / wall, 4) for label, pid in pids.items()}


def with_cpu_share(pid: int, measure: Any) -> dict[str, Any]:
    """``measure()``'s result with the daemon's CPU share while it ran (``cpu_share``, 1.0 = one core)."""
    before, started = cpu_seconds(pid), time.monotonic()
    result = measure()
    result["cpu_share"] = round((cpu_seconds(pid) - before) / (time.monotonic() - started), 3)
    return result


def rows_per_s(result: dict[str, Any], rows: int) -> dict[str, Any]:
    result["rows_per_s"] = round(result["rps"] * rows, 1)
    return result


def configurations(result: dict[str, Any], rounds: list[dict[str, Any]],
                   idle_cpu: dict[str, float]) -> dict[str, Any]:
    """Per cls daemon configuration: rows/s at c=16 (its best round), ratios, CPU share idle and loaded.

    The in-process baseline is ORT one request at a time, the better of its spinning and
    non-spinning sessions (``c16_ort_best``); ``ort_best_batch`` is its best batch's rows/s."""
    one_at_a_time = result["c16_ort_best"]["rps"]
    best_batch = max((best(rounds, key, "rows_per_s", lower=False)
                      for key in ("ort_batch8", "ort_batch16", "ort_nospin_batch16")),
                     key=lambda entry: entry["rows_per_s"])
    kserve = result.get("c16_kserve", {}).get("rps")
    sides = {"batched": "c16_edge", "unbatched": "c16_edge_unbatched", "batched_nospin": "c16_edge_batched_nospin",
             "batched_threaded": "c16_edge_batched_threaded", "unbatched_pool": "c16_edge_unbatched_pool"}
    table: dict[str, Any] = {"ort_one_at_a_time_rows_per_s": one_at_a_time,
                             "ort_best_batch_rows_per_s": best_batch["rows_per_s"]}
    if any("ort_1thread_side_by_side" in r for r in rounds):
        # The most batching can add over unbatched rows run side by side on one-thread sessions (as
        # the daemon runs them under load), before any HTTP: ORT's best batch over that, in process.
        side_by_side = best(rounds, "ort_1thread_side_by_side", "rows_per_s", lower=False)["rows_per_s"]
        per_row = {rows: round(1e3 / best(rounds, f"ort_1thread_batch{rows}", "rows_per_s",
                                          lower=False)["rows_per_s"], 3) for rows in (1, 16)}
        table["one_thread"] = {"row_ms_batch1": per_row[1], "row_ms_batch16": per_row[16],
                               "side_by_side_rows_per_s": side_by_side,
                               "batching_ceiling": round(best_batch["rows_per_s"] / side_by_side, 2)}
    unbatched = best(rounds, "c16_edge_unbatched", "rps", lower=False)["rps"]
    for label, key in sides.items():
        entry = best(rounds, key, "rps", lower=False)
        table[label] = {
            "rows_per_s": entry["rps"], "p50_ms": entry["p50_ms"], "server_us": entry.get("server_us"),
            "vs_ort_one_at_a_time": round(entry["rps"] / one_at_a_time, 2),
            "vs_ort_best_batch": round(entry["rps"] / best_batch["rows_per_s"], 2),
            "vs_kserve": round(entry["rps"] / kserve, 2) if kserve else None,
            "batching_gain": round(entry["rps"] / unbatched, 2),
            "cpu_share_idle": idle_cpu.get(label), "cpu_share_loaded": entry.get("cpu_share"),
        }
    if any("c16_h2load_batched" in r for r in rounds):
        table["h2load"] = h2load_configurations(rounds, one_at_a_time, sides, idle_cpu)
    return table


def h2load_configurations(rounds: list[dict[str, Any]], one_at_a_time: float, labels: Any,
                          idle_cpu: dict[str, float]) -> dict[str, Any]:
    """The c=16 figures of ``configurations`` with h2load as the client (its best round per side)."""
    kserve = best(rounds, "c16_h2load_kserve", "rps", lower=False)["rps"] \
        if any("c16_h2load_kserve" in r for r in rounds) else None
    unbatched = best(rounds, "c16_h2load_unbatched", "rps", lower=False)["rps"]
    table = {}
    for label in labels:
        entry = best(rounds, f"c16_h2load_{label}", "rps", lower=False)
        table[label] = {"rows_per_s": entry["rps"], "mean_ms": entry["mean_ms"], "errors": entry["errors"],
                        "vs_ort_one_at_a_time": round(entry["rps"] / one_at_a_time, 2),
                        "vs_kserve": round(entry["rps"] / kserve, 2) if kserve else None,
                        "batching_gain": round(entry["rps"] / unbatched, 2),
                        "cpu_share_idle": idle_cpu.get(label), "cpu_share_loaded": entry.get("cpu_share")}
    table["kserve_rows_per_s"] = kserve
    return table


def batching_acceptance(result: dict[str, Any], table: dict[str, Any] | None = None) -> dict[str, bool]:
    """The dynamic-batching issue's figures on this run (``table``: the h2load configurations)."""
    table = table or result["configurations"]
    batched, unbatched = table["batched"], table["unbatched"]
    return {
        "c16_batched_at_least_1.3x_ort": batched["vs_ort_one_at_a_time"] >= 1.3,
        "batching_gain_at_least_1.5x": batched["batching_gain"] >= 1.5,
        "unbatched_at_least_0.85x_ort": unbatched["vs_ort_one_at_a_time"] >= 0.85,
        "c16_at_least_8x_kserve": batched["vs_kserve"] is not None and batched["vs_kserve"] >= 8.0,
        "c1_cls_within_0.5_ms": result["ratios"]["c1_cls_overhead_ms"] <= 0.5,
        "idle_cpu_at_most_2_percent_core": (batched["cpu_share_idle"] or 0.0) <= 0.02,
    }


GPU_DRIVER_LIBRARIES = ("libpocl", "libLLVM", "libclang", "libOpenCL", "libvulkan")


def served_on(server: ServerProcess) -> dict[str, Any]:
    """Where the daemon runs its model (its metadata) and which GPU driver libraries it maps."""
    import urllib.request

    model = "det" if "only-det" in str(server.repository) else "cls"
    with urllib.request.urlopen(f"{server.url}/v2/models/{model}", timeout=10) as response:
        metadata = json.loads(response.read())["edge_runtime"]
    maps = Path(f"/proc/{server.process.pid}/maps").read_text()
    return {"backend": metadata.get("backend"), "plans": metadata.get("plans"), "spin": metadata.get("spin"),
            "gpu_driver_libraries": sorted({lib for lib in GPU_DRIVER_LIBRARIES if f"/{lib}" in maps})}


def summarise(rounds: list[dict[str, Any]], idle: dict, peak: dict, cls_body: Any, det_body: Any,
              sessions: dict, cls_x: np.ndarray, det_x: np.ndarray, backend: str = "auto") -> dict[str, Any]:
    result: dict[str, Any] = {"rounds": len(rounds), "cores": os.cpu_count(), "backend": backend}
    for key in ("c16_edge", "c16_edge_unbatched", "c16_kserve", "c16_ort", "c16_ort_nospin"):
        if any(key in r for r in rounds):
            result[key] = best(rounds, key, "rps", lower=False)
    for key in ("c1_cls_edge", "c1_cls_edge_threaded", "c1_cls_ort", "c1_cls_ort_nospin", "c1_det_shm",
                "c1_det_binary", "c1_det_ort", "c1_det_ort_nospin"):
        result[key] = best(rounds, key, "p50_ms", lower=True)
    # The in-process baseline: the better of ORT's default (spinning) and non-spinning sessions.
    for key, metric, lower in (("c16_ort", "rps", False), ("c1_cls_ort", "p50_ms", True),
                               ("c1_det_ort", "p50_ms", True)):
        candidates = [result[key], result[f"{key}_nospin"]]
        result[f"{key}_best"] = (min if lower else max)(candidates, key=lambda entry: entry[metric])
    result["rss_mib"] = {"idle": idle, "peak_under_load": peak}
    cls_out = dict(zip([o.name for o in sessions["cls"].get_outputs()], sessions["cls"].run(None, {"x": cls_x})))
    det_out = dict(zip([o.name for o in sessions["det"].get_outputs()], sessions["det"].run(None, {"x": det_x})))
    result["phases_us"] = {
        "cls_c16": {**codec_phases_us(cls_body, cls_out), **result["c16_edge"]["server_us"]},
        "cls_c1": {**codec_phases_us(cls_body, cls_out), **result["c1_cls_edge"]["server_us"]},
        "det_c1_binary": {**codec_phases_us(det_body, det_out), **result["c1_det_binary"]["server_us"]},
    }
    for name, entry in result["phases_us"].items():
        side = {"cls_c16": "c16_edge", "cls_c1": "c1_cls_edge", "det_c1_binary": "c1_det_binary"}[name]
        known = entry["decode"] + entry["queue"] + entry["compute"] + entry["encode"]
        entry["transport"] = round(max(0.0, result[side]["mean_ms"] * 1e3 - known), 1)
    kserve_rps = result.get("c16_kserve", {}).get("rps")
    result["ratios"] = {
        "c16_vs_kserve": round(result["c16_edge"]["rps"] / kserve_rps, 2) if kserve_rps else None,
        "c16_vs_ort_one_at_a_time": round(result["c16_edge"]["rps"] / result["c16_ort_best"]["rps"], 2),
        "c1_cls_overhead_ms": round(result["c1_cls_edge"]["p50_ms"] - result["c1_cls_ort_best"]["p50_ms"], 3),
        "c1_cls_overhead_ms_threaded": round(result["c1_cls_edge_threaded"]["p50_ms"]
                                            - result["c1_cls_ort_best"]["p50_ms"], 3),
        "c1_det_shm_overhead_ms": round(result["c1_det_shm"]["p50_ms"] - result["c1_det_ort_best"]["p50_ms"], 3),
        "c1_det_binary_overhead_ms": round(result["c1_det_binary"]["p50_ms"] - result["c1_det_ort_best"]["p50_ms"],
                                           3),
    }
    ratios = result["ratios"]
    result["acceptance"] = {
        "c16_at_least_6x_kserve": ratios["c16_vs_kserve"] is not None and ratios["c16_vs_kserve"] >= 6.0,
        "c1_cls_within_0.8_ms": ratios["c1_cls_overhead_ms"] <= 0.8,
        "c1_det_shm_within_0.8_ms": ratios["c1_det_shm_overhead_ms"] <= 0.8,
        "idle_rss_at_most_120_mib": idle["edge"] <= 120.0,
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kserve-python", default=os.environ.get("EDGE_RUNTIME_BENCH_KSERVE_PYTHON"),
                        help="a Python with kserve and onnxruntime (default $EDGE_RUNTIME_BENCH_KSERVE_PYTHON); "
                             "without it the KServe side is left out")
    parser.add_argument("--backend", default="auto",
                        help="[serving] backend of both models (default auto: their default configuration)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=4.0, help="seconds per cls side per round")
    parser.add_argument("--det-duration-s", type=float, default=6.0, help="seconds per det side per round")
    parser.add_argument("--quick", action="store_true", help="1 round, short phases (about 1.5 minutes)")
    parser.add_argument("--no-h2load", action="store_true", help="leave out the c=16 sides driven by h2load")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.duration_s, args.det_duration_s = 1, 2.0, 3.0
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-server-") as tmp:
        result = run(args, Path(tmp))
    publish(result, args.out, "bench_server", plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
