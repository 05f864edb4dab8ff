"""Helpers for the generation tests: model specs, the cache folder, the no-cache oracle, a live server."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from hf_decoders import DecoderSpec

SPECS = {
    "qwen2": DecoderSpec(arch="qwen2", hidden=64, layers=2, heads=4, kv_heads=2, vocab=512, max_positions=256),
    "llama": DecoderSpec(arch="llama", hidden=64, layers=2, heads=4, kv_heads=4, vocab=512, max_positions=256,
                         seed=3),
}


def models_root() -> Path:
    root = Path(os.environ.get("EDGE_RUNTIME_TEST_MODELS", Path.home() / ".cache" / "edge-runtime" / "test-models"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def make_model(folder: Path, **settings):
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings

    return GenerativeModel(folder.name, folder, GenerationSettings(**settings), threads=1)


def oracle_greedy(folder: Path, prompt: list[int], max_new: int, eos: set[int]) -> list[int]:
    """No-cache oracle: recompute the whole sequence each step (empty past), take the argmax."""
    import onnxruntime as ort

    from edge_runtime.generation.engine import kv_names
    from edge_runtime.generation.folder import read_folder

    description = read_folder(folder)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(description.model_path), options, providers=["CPUExecutionProvider"])
    layout = description.kv
    past_names, _ = kv_names(layout.layers)
    tokens = list(prompt)
    out: list[int] = []
    for _ in range(max_new):
        n = len(tokens)
        feeds = {"input_ids": np.array([tokens], np.int64), "attention_mask": np.ones((1, n), np.int64)}
        if description.has_position_ids:
            feeds["position_ids"] = np.arange(n, dtype=np.int64)[None]
        for name in past_names:
            feeds[name] = np.zeros((1, layout.kv_heads, 0, layout.head_dim), layout.dtype)
        token = int(np.argmax(session.run(["logits"], feeds)[0][0, -1]))
        out.append(token)
        tokens.append(token)
        if token in eos:
            break
    return out


class LiveServer:
    """The real app on 127.0.0.1 in a background thread, for synchronous clients (openai)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name="live-server", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "LiveServer":
        self._thread.start()
        if not self._started.wait(120):
            raise RuntimeError("live server did not start within 120 s")
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        from aiohttp import web

        self._stop = asyncio.Event()
        runner = web.AppRunner(self.app, handle_signals=False, shutdown_timeout=5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        self._started.set()
        await self._stop.wait()
        await runner.cleanup()
