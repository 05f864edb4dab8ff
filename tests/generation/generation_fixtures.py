"""Helpers for the generation tests: model specs, the cache folder, the no-cache oracle, a live server's URL."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from hf_decoders import DecoderSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from server_fixtures import LiveServer  # noqa: E402  (the server tests' live app, reused)

SPECS = {
    "qwen2": DecoderSpec(arch="qwen2", hidden=64, layers=2, heads=4, kv_heads=2, vocab=512, max_positions=256),
    "llama": DecoderSpec(arch="llama", hidden=64, layers=2, heads=4, kv_heads=4, vocab=512, max_positions=256,
                         seed=3),
}


def models_root() -> Path:
    root = Path(os.environ.get("EDGE_RUNTIME_TEST_MODELS", Path.home() / ".cache" / "edge-runtime" / "test-models"))
    root.mkdir(parents=True, exist_ok=True)
    return root


# Settings a fixture gives every model made from one of its folders (a variant of a folder, e.g. the
# optimum export served as exported); make_model's own settings override them.
FOLDER_SETTINGS: dict[Path, dict[str, Any]] = {}


def make_model(folder: Path, **settings):
    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings

    settings = {**FOLDER_SETTINGS.get(Path(folder), {}), **settings}
    return GenerativeModel(folder.name, folder, GenerationSettings(**settings), threads=1)


def unfused_variant(export: Path, where: Path) -> Path:
    """``export``'s files linked into ``where``, a folder whose models serve the export as exported
    (``fuse_exports`` off: the unfused graph's ping-pong KV), through ``make_model``."""
    where.mkdir(parents=True, exist_ok=True)
    for item in export.iterdir():
        (where / item.name).symlink_to(item)
    FOLDER_SETTINGS[where] = {"fuse_exports": False}
    return where


def oracle_greedy(folder: Path, prompt: list[int], max_new: int, eos: set[int], precision: str = "") -> list[int]:
    """No-cache oracle: recompute the whole sequence each step (empty past), take the argmax; the folder's
    graph as exported (``precision``: which file of the onnx/ layout)."""
    import onnxruntime as ort

    from edge_runtime.generation.engine import kv_names
    from edge_runtime.generation.folder import read_folder

    description = read_folder(folder, precision)
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



def base_url(server: LiveServer) -> str:
    return f"http://{server.url}"


def openai_client(server: LiveServer, timeout_s: float = 120) -> Any:
    """The ``openai`` client of ``server``'s OpenAI routes (no retries: a test sees each answer)."""
    import openai

    return openai.OpenAI(base_url=base_url(server) + "/v1", api_key="unused", max_retries=0, timeout=timeout_s)


def post_json(server: LiveServer, path: str, body: Any) -> tuple[int, Any]:
    """(status, decoded JSON answer) of a POST with a JSON body; error statuses are answers too."""
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(base_url(server) + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@contextlib.contextmanager
def served_repository(root: Path, cache_dir: Path, cloud: Any = None) -> Iterator[LiveServer]:
    """A live edge-runtime app over the model repository ``root`` (one intra-op thread, no OpenCL
    probe; ``cloud``: the server's ``CloudConfig``), stopped and its runtime closed on exit."""
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime
    from edge_runtime.server.app import create_app
    from edge_runtime.server.config import ServerConfig
    from edge_runtime.serving.repository import ModelRepository

    runtime = Runtime(RuntimeConfig(cache_dir=cache_dir, probe_opencl=False, intra_op_threads=1))
    live = LiveServer(create_app(ServerConfig(), ModelRepository(root, runtime, cloud=cloud,
                                                                 drain_timeout_s=5.0))).start()
    try:
        yield live
    finally:
        live.stop()
        runtime.close()


def start_vlm_peer(tmp_path_factory: Any, folder: Path, token: str) -> Any:
    """A second edge-runtime process serving the VLM ``folder`` as ``agent`` (plan cpu), behind
    ``token``: the cloud peer of the edge tests. Stop it with ``.stop()``."""
    import shutil

    from cloud_peer import ServerProcess

    root = tmp_path_factory.mktemp("vlm-peer-repository")
    shutil.copytree(folder, root / "agent" / "1")
    (root / "agent" / "config.toml").write_text('[vision]\nplan = "cpu"\n')
    return ServerProcess.start(root, tmp_path_factory.mktemp("vlm-peer-logs") / "peer.log",
                               env={"EDGE_RUNTIME_TOKEN": token}, timeout_s=180)
