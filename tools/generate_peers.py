"""The engines ``tools/bench_generate.py`` measures ours against, each as a user would run it.

* ``JsonWorker``: a worker script in a venv of its own (onnxruntime-genai needs
  transformers 5.x; llama-cpp-python is built from its sdist), one JSON command per
  line on stdin, one JSON answer per line on stdout — nothing of theirs is imported
  here, and their threads never share our process.
* ``genai_worker``: ``tools/genai_worker.py`` on a folder its model builder wrote
  (fp32 or int4) from the Hugging Face checkpoint.
* ``llamacpp_workers``: ``tools/llamacpp_worker.py`` on GGUF files that llama.cpp's
  ``convert_hf_to_gguf.py`` (f32) and its quantizer (q8_0, q4_0) wrote from the same
  checkpoint.
* ``PlainLoop``: a hand-written ONNX Runtime loop, ``present`` fed back as ``past``.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

TOOLS = Path(__file__).resolve().parent
LLAMACPP_PRECISIONS = ("f32", "q8_0", "q4_0")


class JsonWorker:
    """A worker process answering one JSON line per command; the first line it prints is its greeting."""

    def __init__(self, argv: list[str], what: str) -> None:
        self.what = what
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.version = self._read()["version"]

    def _read(self) -> dict[str, Any]:
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        if not line:  # its stdout closed: it has exited or is exiting
            raise RuntimeError(f"the {self.what} worker exited (code {self.process.wait(timeout=60)})")
        return json.loads(line)

    def ask(self, **command: Any) -> dict[str, Any]:
        self.process.stdin.write(json.dumps(command) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        answer = self._read()
        if "error" in answer:
            raise RuntimeError(f"{self.what}: {answer['error']}")
        return answer

    def close(self) -> None:
        self.process.stdin.close()  # type: ignore[union-attr]
        self.process.wait(timeout=60)


def genai_worker(python: str, hf: Path, folder: Path, threads: int, precision: str = "fp32") -> JsonWorker:
    """onnxruntime-genai on ``folder`` (built by its model builder from ``hf`` at ``precision`` when missing)."""
    worker = str(TOOLS / "genai_worker.py")
    if not (folder / "genai_config.json").is_file():
        subprocess.run([python, worker, "build", str(hf), str(folder), precision], check=True)
    return JsonWorker([python, worker, "serve", str(folder), str(threads)], f"onnxruntime-genai {precision}")


def llamacpp_workers(python: str, hf: Path, folder: Path, threads: int, ctx: int) -> dict[str, JsonWorker]:
    """llama.cpp at f32 / q8_0 / q4_0, one process per GGUF file (converted from ``hf`` when missing)."""
    worker = str(TOOLS / "llamacpp_worker.py")
    if not all((folder / f"{p}.gguf").is_file() for p in LLAMACPP_PRECISIONS):
        subprocess.run([python, worker, "gguf", str(hf), str(folder)], check=True)
    return {p: JsonWorker([python, worker, "serve", str(folder / f"{p}.gguf"), str(threads), str(ctx)],
                          f"llama.cpp {p}") for p in LLAMACPP_PRECISIONS}


class PlainLoop:
    """What a user writes by hand: ORT session, present fed back as past through numpy."""

    def __init__(self, model_path: Path, threads: int, layers: int, kv_heads: int, head_dim: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        self.names = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
        self.empty = np.zeros((1, kv_heads, 0, head_dim), np.float32)

    def run(self, prompt: list[int], new: int) -> dict[str, Any]:
        started = time.perf_counter()
        n = len(prompt)
        feeds = {"input_ids": np.array([prompt], np.int64), "attention_mask": np.ones((1, n), np.int64),
                 "position_ids": np.arange(n, dtype=np.int64)[None], **{k: self.empty for k in self.names}}
        outputs = self.session.run(None, feeds)
        tokens = [int(np.argmax(outputs[0][0, -1]))]
        first = time.perf_counter()
        for _ in range(new - 1):
            length = n + len(tokens) - 1
            feeds = {"input_ids": np.array([[tokens[-1]]], np.int64),
                     "attention_mask": np.ones((1, length + 1), np.int64),
                     "position_ids": np.array([[length]], np.int64), **dict(zip(self.names, outputs[1:]))}
            outputs = self.session.run(None, feeds)
            tokens.append(int(np.argmax(outputs[0][0, -1])))
        end = time.perf_counter()
        return {"ttft_ms": (first - started) * 1e3, "decode_tokens_per_s": (new - 1) / (end - first),
                "tokens": tokens}
