"""A second edge-runtime process as the cloud peer: ``python -m edge_runtime serve`` on loopback.

Started on 127.0.0.1 and a free port with one intra-op thread, waited for
until ``/v2/health/ready`` answers, ended by its PID (SIGTERM, then SIGKILL).
Used by the cloud tests and ``tools/bench_cloud.py``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ServerProcess:
    """A ``python -m edge_runtime serve`` subprocess; ``stop()`` ends it by PID."""

    repository: Path
    port: int
    process: subprocess.Popen
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, repository: Path, log_path: Path, *, port: int | None = None,
              env: Mapping[str, str] | None = None, timeout_s: float = 60.0,
              args: Sequence[str] = ()) -> "ServerProcess":
        """``args``: more ``serve`` options (``--grpc-port N``)."""
        port = port or free_port()
        environment = {**os.environ, "EDGE_RUNTIME_THREADS": "1", **(env or {})}
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "edge_runtime", "serve", "--host", "127.0.0.1", "--port", str(port),
                 "--model-repository", str(repository), *args],
                cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT)
        server = cls(repository, port, process, log_path)
        server.wait_ready(timeout_s)
        return server

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"edge-runtime serve exited with {self.process.returncode}: "
                                   f"{self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"edge-runtime serve not ready within {timeout_s} s: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)
