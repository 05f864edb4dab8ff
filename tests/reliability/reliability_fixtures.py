"""Helpers of the reliability suite: a gated plan, a daemon process, error-body checks, MLP requests,
the tiny decoder and a server-sent-events reader for the generation routes."""

from __future__ import annotations

import json
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


# -- generation -----------------------------------------------------------------------------------
CHAT = [{"role": "user", "content": "open the settings menu then scroll down"}]


def write_tiny_decoder(folder: Path, max_positions: int = 256, seed: int = 1) -> Path:
    """The torch-free Qwen2-style decoder of ``edge_runtime.decoder_zoo`` (random weights, a local
    tokenizer; ~1 s to build, ~0.7 MB): a real generative model folder, fast on two cores."""
    from edge_runtime.decoder_zoo import DecoderShape, write_decoder_folder

    return write_decoder_folder(folder, DecoderShape(hidden=64, intermediate=128, vocab=600,
                                                     max_positions=max_positions), seed=seed)


def generation_config(**settings: int) -> str:
    """A model ``config.toml`` with a ``[generation]`` table (the prefix cache off unless given, so the
    prefill counter counts every admitted prompt)."""
    table = {"prefix_cache_bytes": 0, **settings}
    return "[generation]\n" + "".join(f"{key} = {value}\n" for key, value in table.items())


@dataclass
class StreamResult:
    """One server-sent-events answer as the client saw it.

    ``events``: the parsed ``data:`` payloads (``[DONE]`` excluded); ``done``: ``data: [DONE]`` came;
    ``cut``: the HTTP body ended without its terminator (the connection closed mid-answer);
    ``truncated``: bytes after the last complete event (a JSON chunk cut in half), empty when clean.
    """

    status: int
    events: list[Any] = field(default_factory=list)
    done: bool = False
    cut: bool = False
    truncated: bytes = b""
    after_done: int = 0  # events sent after [DONE] (there must be none)

    @property
    def error(self) -> Any:
        """The ``error`` of an error event (the stream failed after it began; a Responses stream's
        ``response.failed``), or None."""
        for event in self.events:
            if isinstance(event, dict) and "error" in event:
                return event["error"]
            if isinstance(event, dict) and event.get("type") == "response.failed":
                return event["response"]["error"]
        return None

    @property
    def text(self) -> str:
        """The generated text: chat deltas, completion texts or Triton ``text_output``s, in order."""
        parts = []
        for event in self.events:
            if not isinstance(event, dict) or "error" in event:
                continue
            if "text_output" in event:
                parts.append(event["text_output"])
            if event.get("type") == "response.output_text.delta":
                parts.append(event["delta"])
            for choice in event.get("choices") or []:
                parts.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
        return "".join(parts)

    @property
    def finish_reason(self) -> str | None:
        for event in reversed(self.events):
            if isinstance(event, dict):
                if event.get("finish_reason"):
                    return event["finish_reason"]
                for choice in event.get("choices") or []:
                    if choice.get("finish_reason"):
                        return choice["finish_reason"]
        return None


async def read_sse(response: Any, on_event: Any = None) -> StreamResult:
    """Read an aiohttp response as server-sent events; every complete event must be whole JSON.

    ``on_event(event)`` is called as each event arrives (a test may act mid-stream).
    """
    import aiohttp

    result = StreamResult(response.status)
    buffer = b""
    try:
        async for data in response.content.iter_any():
            buffer += data
            while b"\n\n" in buffer:
                block, buffer = buffer.split(b"\n\n", 1)
                for event in _take(result, block):
                    if on_event is not None:
                        on_event(event)
    except aiohttp.ClientPayloadError:
        result.cut = True
    result.truncated = buffer.strip()
    return result


def _take(result: StreamResult, block: bytes) -> list[Any]:
    """Add one event block's payloads to ``result``; returns the new events."""
    new = []
    lines = [line for line in block.split(b"\n") if line.strip()]
    for line in lines:
        assert line.startswith(b"data: "), f"not a server-sent event: {line[:200]!r}"
        payload = line[6:].strip()
        if payload == b"[DONE]":
            result.done = True
            continue
        try:
            event = json.loads(payload)
        except ValueError:
            raise AssertionError(f"a truncated or malformed JSON chunk: {payload[:200]!r}") from None
        if result.done:
            result.after_done += 1
        result.events.append(event)
        new.append(event)
    return new
