"""onnxruntime-genai side of ``tools/bench_generate.py``, run in its own venv (transformers 5.x, onnx-ir).

``python tools/genai_worker.py build HF_FOLDER OUT [fp32|int4]`` runs genai's model builder
(cpu; fp32 by default, or int4: its MatMulNBits at accuracy level 4) and sets the session's intra-op threads; ``python
tools/genai_worker.py serve GENAI_FOLDER THREADS`` reads one JSON command per
line on stdin and answers one JSON line on stdout:

* ``{"cmd": "single", "prompt": [ids], "new": N}`` -> time to first token, decode tokens/s, tokens
* ``{"cmd": "batch", "prompts": [[ids], ...], "new": N}`` -> aggregate tokens/s of a static batch

Greedy (``do_sample`` false) with ``min_length`` = ``max_length`` so random weights run all N tokens.
This file imports only onnxruntime_genai and the standard library: it never imports edge_runtime.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def build(hf_folder: str, out: str, precision: str = "fp32") -> None:
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf_folder, "-o", out,
                    "-p", precision, "-e", "cpu", "-c", str(Path(out).with_name(Path(out).name + ".cache"))],
                   check=True, stdout=subprocess.DEVNULL)


def set_threads(folder: str, threads: int) -> None:
    path = Path(folder) / "genai_config.json"
    config = json.loads(path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    options["intra_op_num_threads"] = threads
    options["inter_op_num_threads"] = 1
    path.write_text(json.dumps(config, indent=2))


def _generator(og, model, prompts: list[list[int]], new: int):
    params = og.GeneratorParams(model)
    length = len(prompts[0]) + new
    params.set_search_options(max_length=length, min_length=length, do_sample=False, batch_size=len(prompts))
    generator = og.Generator(model, params)
    return generator


def single(og, model, prompt: list[int], new: int) -> dict:
    started = time.perf_counter()
    generator = _generator(og, model, [prompt], new)
    generator.append_tokens([prompt])
    generator.generate_next_token()
    tokens = [int(generator.get_next_tokens()[0])]
    first = time.perf_counter()
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    end = time.perf_counter()
    return {"ttft_ms": (first - started) * 1e3, "decode_tokens_per_s": (len(tokens) - 1) / (end - first),
            "tokens": tokens}


def batch(og, model, prompts: list[list[int]], new: int) -> dict:
    started = time.perf_counter()
    generator = _generator(og, model, prompts, new)
    generator.append_tokens(prompts)
    steps = 0
    while not generator.is_done():
        generator.generate_next_token()
        steps += 1
    elapsed = time.perf_counter() - started
    return {"aggregate_tokens_per_s": steps * len(prompts) / elapsed, "steps": steps}


def serve(folder: str, threads: int) -> None:
    import onnxruntime_genai as og

    set_threads(folder, threads)
    model = og.Model(folder)
    print(json.dumps({"ready": True, "version": og.__version__}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "single":
            answer = single(og, model, command["prompt"], command["new"])
        elif command["cmd"] == "batch":
            answer = batch(og, model, command["prompts"], command["new"])
        else:
            answer = {"error": f"unknown command {command['cmd']!r}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(*sys.argv[2:5])
    elif sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    else:
        raise SystemExit("usage: genai_worker.py build HF_FOLDER OUT [fp32|int4] | serve GENAI_FOLDER THREADS")
