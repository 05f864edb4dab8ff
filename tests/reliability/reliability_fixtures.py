"""Helpers of the reliability suite: a gated plan, a daemon process, error-body checks, MLP requests."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from cloud_peer import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
GATE = threading.Event()  # the ``gated`` model's plan runs only while this is set
GATE.set()
GATE_LIMIT_S = 60.0  # a gate never opened fails the run instead of hanging the suite
MLP_INPUT = "input"
TOKEN = "reliability-token"  # the live server of the fuzzers requires it, as a public bind would
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class GatedPlan:
    """Wraps a plan so that each run waits for ``GATE``: a request holds the worker until the test says.

    ``runs`` counts the runs that started (the structural proof that a rejected
    request never ran).
    """

    name: str
    backends: tuple[str, ...]
    inner: Any
    runs: list[int] = field(default_factory=list)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.runs.append(1)
        if not GATE.wait(GATE_LIMIT_S):
            raise TimeoutError(f"the test never opened the gate within {GATE_LIMIT_S} s")
        return self.inner.run(feeds)


GATED: dict[str, GatedPlan] = {}  # plan name -> the gated plan of the last ``gated`` model loaded


def gated_plans(model: Any) -> dict[str, Any]:
    """``extra_plans``: the ``gated`` model's plans wait on ``GATE``; other models are untouched."""
    from edge_runtime.scheduler import model_plans

    if model.name != "gated":
        return {}
    plans = {name: GatedPlan(plan.name, plan.backends, plan) for name, plan in model_plans(model).items()}
    GATED.clear()
    GATED.update(plans)
    return plans


def gated_runs() -> int:
    return sum(len(plan.runs) for plan in GATED.values())


def scaled(ci_examples: int) -> int:
    """An example count set for the ``ci`` profile (120 per property), scaled to the loaded profile."""
    from hypothesis import settings

    return max(ci_examples, settings.default.max_examples * ci_examples // 120)


def mlp_feeds(seed: int, rows: int = 1) -> dict[str, np.ndarray]:
    return {MLP_INPUT: np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)}


def assert_names_the_problem(status: int, body: bytes, context: str = "") -> None:
    """A 4xx/5xx answer must say what was wrong: ``{"error": "<message>"}`` (KServe v2 routes) or
    ``{"error": {"message": "<message>", ...}}`` (OpenAI-compatible routes)."""
    import json

    try:
        document = json.loads(body)
    except ValueError:
        raise AssertionError(f"{context}: {status} with a non-JSON body {body[:200]!r}") from None
    error = document.get("error") if isinstance(document, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    assert isinstance(message, str) and message.strip(), f"{context}: {status} without an error message: {body[:200]!r}"


def _limit_files(max_bytes: int) -> None:
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))


def _copy_lines(stream: Any, log_path: Path) -> None:
    with open(log_path, "ab") as log:
        for line in stream:
            log.write(line)
            log.flush()


class Daemon(ServerProcess):
    """``python -m edge_runtime serve`` at INFO, its log in a file; ``stop()`` ends it by PID (the cloud
    suite's ``ServerProcess``, plus a config file, a file-size limit and an RSS reading)."""

    @classmethod
    def start(cls, repository: Path, cache: Path, log_path: Path, *,  # type: ignore[override]
              config: Path | None = None, env: Mapping[str, str] | None = None, timeout_s: float = 120.0,
              max_file_bytes: int | None = None) -> "Daemon":
        """``max_file_bytes``: RLIMIT_FSIZE of the daemon (a full disk: writes past it fail with EFBIG);
        its log then comes through a pipe, which the limit does not touch."""
        port = free_port()
        environment = {**os.environ, "EDGE_RUNTIME_CACHE": str(cache), "PYTHONPATH": str(ROOT),
                       "EDGE_RUNTIME_THREADS": "1", **(env or {})}
        command = [sys.executable, "-m", "edge_runtime", "--log-level", "INFO", "serve", "--port", str(port),
                   "--model-repository", str(repository), *(["--config", str(config)] if config else [])]
        if max_file_bytes is None:
            with open(log_path, "ab") as log:
                process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT)
        else:
            process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, preexec_fn=lambda: _limit_files(max_file_bytes))
            threading.Thread(target=_copy_lines, args=(process.stdout, log_path), daemon=True).start()
        daemon = cls(repository, port, process, log_path)
        daemon.wait_ready(timeout_s)
        return daemon

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_bytes(self) -> int:
        import psutil

        return psutil.Process(self.process.pid).memory_info().rss

    def stop(self) -> int:  # type: ignore[override]
        """SIGTERM, wait, SIGKILL if it did not end; returns the exit code."""
        super().stop()
        return self.process.returncode
