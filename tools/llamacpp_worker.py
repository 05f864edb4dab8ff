"""llama.cpp side of ``tools/bench_generate.py``, run in its own venv (llama-cpp-python built from its sdist).

``python tools/llamacpp_worker.py gguf HF_FOLDER OUT_FOLDER`` writes ``f32.gguf``
with llama.cpp's own ``convert_hf_to_gguf.py`` (the copy vendored in the
llama-cpp-python sdist, found under ``$EDGE_RUNTIME_LLAMACPP_SRC`` or
``<venv>/src/llama_cpp_python-*/vendor/llama.cpp``; run as it is, except that a BPE
pre-tokenizer it does not recognise is labelled instead of refused: see
``PRE_TOKENIZER``), then ``q8_0.gguf`` and
``q4_0.gguf`` with llama.cpp's quantizer (``llama_model_quantize``, as the
``llama-quantize`` tool calls it). ``python tools/llamacpp_worker.py serve GGUF
THREADS CTX`` loads one file and answers one JSON line per command line on stdin:

* ``{"cmd": "single", "prompt": [ids], "new": N}`` -> time to first token, decode tokens/s, tokens
* ``{"cmd": "batch", "prompts": [[ids], ...], "new": N}`` -> aggregate tokens/s, every prompt a
  sequence of its own in one ``llama_batch`` per step (llama.cpp's batched decoding)

Greedy (argmax of the last logits row), EOS ignored, the KV cache cleared before
every run so no run reuses the previous prompt. Timing as the other engines:
first token = after prefill; decode tokens/s = (N - 1) / time after it.
This file imports only llama_cpp (and the converter), numpy and the standard library.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

QUANT_TYPES = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0"}
# The converter identifies a BPE pre-tokenizer by hashing its output on a test
# text; our locally trained byte-level BPE (GPT-2 style pre-tokenisation) is in
# no list, so it would refuse. The benchmark feeds token ids, never text, so the
# name only labels the vocabulary: "gpt-2" is the pre-tokenizer ours matches.
PRE_TOKENIZER = "gpt-2"

_CONVERT_SHIM = """
import sys
sys.path.insert(0, sys.argv.pop(1))
import conversion.base as base
original = base.TextModel.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return original(self, tokenizer)
    except NotImplementedError:
        return {pre!r}
base.TextModel.get_vocab_base_pre = get_vocab_base_pre
import runpy
sys.argv[0] = sys.path[0] + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _llamacpp_source() -> Path:
    configured = os.environ.get("EDGE_RUNTIME_LLAMACPP_SRC")
    candidates = [Path(configured)] if configured else sorted((Path(sys.prefix) / "src").glob(
        "llama_cpp_python-*/vendor/llama.cpp"))
    for path in candidates:
        if (path / "convert_hf_to_gguf.py").is_file():
            return path
    raise SystemExit("llama.cpp's convert_hf_to_gguf.py not found: unpack the llama-cpp-python sdist under "
                     f"{Path(sys.prefix) / 'src'} or set EDGE_RUNTIME_LLAMACPP_SRC to its vendor/llama.cpp")


def gguf(hf_folder: str, out: str) -> None:
    import llama_cpp

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    f32 = folder / "f32.gguf"
    if not f32.is_file():
        tmp = folder / "f32.gguf.tmp"
        subprocess.run([sys.executable, "-c", _CONVERT_SHIM.format(pre=PRE_TOKENIZER), str(_llamacpp_source()),
                        hf_folder, "--outtype", "f32", "--outfile", str(tmp)], check=True, stdout=subprocess.DEVNULL)
        tmp.replace(f32)
    for name, ftype in QUANT_TYPES.items():
        target = folder / f"{name}.gguf"
        if target.is_file():
            continue
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, ftype)
        params.nthread = os.cpu_count() or 1
        tmp = folder / f"{name}.gguf.tmp"
        if llama_cpp.llama_model_quantize(str(f32).encode(), str(tmp).encode(), ctypes.byref(params)) != 0:
            raise SystemExit(f"llama_model_quantize failed for {name}")
        tmp.replace(target)


class Sequences:
    """A llama.cpp context of ``ctx`` tokens per sequence for up to ``streams`` sequences, decoded greedily."""

    def __init__(self, llm: object, ctx: int, streams: int) -> None:
        import llama_cpp
        import numpy as np

        self.lib, self.np = llama_cpp, np
        if streams == 1:
            self.ctx = llm.ctx  # the context Llama made, as a user of llama-cpp-python gets it
        else:
            # Llama() makes a one-sequence context; a second context on the same weights takes
            # `streams` sequences (each its own `ctx` cells: the KV is not unified).
            params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
            params.n_seq_max, params.n_ctx = streams, ctx * streams
            self.ctx = llama_cpp.llama_init_from_model(llm.model, params)
            if self.ctx is None:
                raise RuntimeError(f"llama_init_from_model failed for {streams} sequences")
        self.streams, self.vocab = streams, llm.n_vocab()
        self.n_batch = llm.n_batch
        self.batch = llama_cpp.llama_batch_init(max(self.n_batch, streams), 0, streams)

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """entries: (token, position, sequence, wants logits), at most n_batch of them."""
        batch = self.batch
        batch.n_tokens = len(entries)
        for i, (token, position, sequence, logits) in enumerate(entries):
            batch.token[i], batch.pos[i] = token, position
            batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, sequence, logits
        if self.lib.llama_decode(self.ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    def argmax(self, row: int) -> int:
        logits = self.np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.ctx, row), shape=(self.vocab,))
        return int(logits.argmax())

    def prefill(self, prompt: list[int], sequence: int) -> int:
        for start in range(0, len(prompt), self.n_batch):
            chunk = prompt[start:start + self.n_batch]
            self.decode([(t, start + i, sequence, start + i == len(prompt) - 1) for i, t in enumerate(chunk)])
        return self.argmax(-1)


def single(one: Sequences, prompt: list[int], new: int) -> dict:
    """One sequence from an empty cache (Llama.generate() would reuse the last prompt's KV and flatter TTFT)."""
    one.clear()
    started = time.perf_counter()
    tokens = [one.prefill(prompt, 0)]
    first = time.perf_counter()
    for step in range(new - 1):
        one.decode([(tokens[-1], len(prompt) + step, 0, True)])
        tokens.append(one.argmax(-1))
    end = time.perf_counter()
    return {"ttft_ms": (first - started) * 1e3, "decode_tokens_per_s": (new - 1) / (end - first),
            "tokens": tokens}


def batch(many: Sequences, prompts: list[list[int]], new: int) -> dict:
    """Each prompt prefilled as its own sequence, then one batched decode step per token for all."""
    many.clear()
    started = time.perf_counter()
    last = [many.prefill(prompt, s) for s, prompt in enumerate(prompts)]
    for step in range(new - 1):
        many.decode([(last[s], len(p) + step, s, True) for s, p in enumerate(prompts)])
        last = [many.argmax(s) for s in range(len(prompts))]
    return {"aggregate_tokens_per_s": new * len(prompts) / (time.perf_counter() - started)}


def serve(path: str, threads: int, ctx: int) -> None:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, n_ctx=ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
    one, many = Sequences(llm, ctx, 1), None
    print(json.dumps({"ready": True, "version": llama_cpp.__version__}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "single":
            answer = single(one, command["prompt"], command["new"])
        elif command["cmd"] == "batch":
            if many is None or many.streams < len(command["prompts"]):
                many = Sequences(llm, ctx, len(command["prompts"]))
            answer = batch(many, command["prompts"], command["new"])
        else:
            answer = {"error": f"unknown command {command['cmd']!r}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "gguf":
        gguf(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit("usage: llamacpp_worker.py gguf HF_FOLDER OUT_FOLDER | serve GGUF THREADS CTX")
