"""Benchmark: the per-token loop — in-process ``Model.stream`` against HTTP streaming from ``edge-runtime serve``.

The ~31M-parameter Qwen2-style model of ``tools/bench_generate.py`` (random weights, fp32),
our fused graph (``decoder_zoo.decoder_folder_from_hf(fused=True)``: GroupQueryAttention,
KV in place). Two sides, interleaved round by round, best of rounds:

* ``in_process``: ``GenerativeModel.stream`` in this process (the embedded API);
* ``http``: ``POST /v1/completions`` with ``stream: true`` to a ``python -m edge_runtime
  serve`` subprocess on loopback (the daemon a user runs), read by an aiohttp client.

Both generate ``--new-tokens`` greedy tokens (``ignore_eos``) after a 64-token prompt; decode
tokens/s is (tokens - 1) / (time of the last chunk - time of the first). The report gives the
HTTP / in-process ratio (issue #24's goal: >= 0.9).

Then ``--rounds`` more in-process streams with ``perf_counter`` probes around the loop's parts,
the one with the shortest step kept (the probes cost a little themselves, so these are not
among the timed rounds): ORT's run,
binding and feeds (the rest of ``DecoderEngine.decode``; NOTE: this includes taking the GIL back
when the run returns, while the consumer's event loop may hold it — binding alone is ~15 us), sampling,
detokenisation, stop
checks, the hand-off to the consumer (the rest of ``Sequence.accept``: chunk and sink), the
batcher's own bookkeeping and its loop — each as a share of the decode step. The HTTP side's
extra cost per token (SSE encode and write, the client) is the difference of the two sides'
step times; one SSE event's encoding is timed apart.

Usage: ``python tools/bench_token_loop.py [--threads 2] [--rounds 3] [--new-tokens 128] [--out DIR]``
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tools"):
    if str(_path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(_path))

from bench_generate import SPEC  # noqa: E402
from bench_report import publish  # noqa: E402
from cloud_peer import ServerProcess  # noqa: E402
from hf_decoders import hf_folder  # noqa: E402

MODEL = "chat"


def fused_folder(models: Path) -> Path:
    """The fused folder ``bench_generate`` / ``bench_fused_decode`` build (made here when missing)."""
    from edge_runtime.decoder_zoo import decoder_folder_from_hf

    folder = models / f"fused-{SPEC.key}"
    if not (folder / "model.onnx").is_file():
        decoder_folder_from_hf(hf_folder(SPEC, models), folder, fused=True)
    return folder


async def in_process(model: Any, prompt: list[int], new: int) -> dict[str, Any]:
    stamps: list[float] = []
    tokens = 0
    async for chunk in model.stream(prompt, max_tokens=new, ignore_eos=True):
        stamps.append(time.perf_counter())
        tokens += len(chunk.token_ids)
    return _rates(stamps, tokens)


async def http(session: Any, url: str, prompt: list[int], new: int) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": new, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    stamps: list[float] = []
    tokens = 0
    async with session.post(f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if event["choices"]:  # the usage event carries no choice: not a token's arrival
                stamps.append(time.perf_counter())
    return _rates(stamps, tokens)


def _rates(stamps: list[float], tokens: int) -> dict[str, Any]:
    decode_s = stamps[-1] - stamps[0]
    return {"tokens": tokens, "decode_tokens_per_s": round((tokens - 1) / decode_s, 1),
            "step_ms": round(decode_s / (tokens - 1) * 1e3, 3)}


class Probes:
    """Accumulated ``perf_counter`` time per label around wrapped callables (attributes replaced)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = owner.__dict__[name] if name in getattr(owner, "__dict__", {}) else getattr(owner, name)
        bound = getattr(owner, name)

        def probed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return bound(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - started
                self.calls[label] += 1

        self._undo.append((owner, name, original))
        setattr(owner, name, probed)

    def restore(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    def per_call_us(self, label: str) -> float:
        return self.seconds[label] / max(self.calls[label], 1) * 1e6


def breakdown(model: Any, prompt: list[int], new: int, rounds: int) -> dict[str, Any]:
    """Probed in-process streams, the one with the shortest step kept (the least disturbed by other
    work on the machine): each part's microseconds per decode step and share of the step."""
    return min((probed_stream(model, prompt, new) for _ in range(rounds)), key=lambda parts: parts["step_us"])


def probed_stream(model: Any, prompt: list[int], new: int) -> dict[str, Any]:
    from edge_runtime.generation import detokenizer, sampling, sequence

    probes = Probes()
    probes.wrap(model.engine.session, "run_with_iobinding", "ort_run")
    probes.wrap(model.engine, "decode", "engine_decode")
    probes.wrap(sampling.Sampler, "choose", "sampling")
    probes.wrap(detokenizer.IncrementalDetokenizer, "push", "detokenise")
    probes.wrap(sampling.StopMatcher, "feed", "stop_checks")
    probes.wrap(sequence.Sequence, "accept", "accept")
    probes.wrap(model.batcher, "_decode_step", "decode_step")
    try:
        stream = asyncio.run(in_process(model, prompt, new))
    finally:
        probes.restore()
    us = probes.per_call_us
    step_us = stream["step_ms"] * 1e3
    parts = {
        "ort_run": us("ort_run"),
        "binding_feeds_and_gil_reentry": us("engine_decode") - us("ort_run"),
        "sampling": us("sampling"),
        "detokenise": us("detokenise"),
        "stop_checks": us("stop_checks"),
        "chunk_and_handoff": us("accept") - us("sampling") - us("detokenise") - us("stop_checks"),
        "batcher_bookkeeping": us("decode_step") - us("engine_decode") - us("accept"),
    }
    parts["batcher_loop_and_rest"] = step_us - sum(parts.values())
    return {"step_us": round(step_us, 1),
            "parts_us": {k: round(v, 1) for k, v in parts.items()},
            "parts_share": {k: round(v / step_us, 4) for k, v in parts.items()},
            "per_token_loop_share": round(1 - parts["ort_run"] / step_us, 4)}


def sse_encode_us(repeats: int = 2000) -> float:
    """One ``text_completion`` chunk's SSE encoding as the server does it, microseconds."""
    from edge_runtime.server.generation_http import sse_event

    event = {"id": "cmpl-" + "0" * 32, "object": "text_completion", "created": 0, "model": MODEL,
             "choices": [{"index": 0, "text": " token", "logprobs": None, "finish_reason": None}]}
    started = time.perf_counter()
    for _ in range(repeats):
        sse_event(event)
    return round((time.perf_counter() - started) / repeats * 1e6, 2)


async def rounds(model: Any, url: str, prompt: list[int], args: argparse.Namespace) -> dict[str, list]:
    import aiohttp

    results: dict[str, list] = {"in_process": [], "http": []}
    async with aiohttp.ClientSession() as session:
        await in_process(model, prompt, 8)  # warm both sides (first runs allocate)
        await http(session, url, prompt, 8)
        for index in range(args.rounds):
            order: list[tuple[str, Callable]] = [("in_process", lambda: in_process(model, prompt, args.new_tokens)),
                                                 ("http", lambda: http(session, url, prompt, args.new_tokens))]
            for name, run in order if index % 2 == 0 else order[::-1]:
                results[name].append(await run())
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of both sides (default 2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "token-loop")
    parser.add_argument("--models", type=Path, default=Path.home() / ".cache" / "edge-runtime" / "bench-models")
    args = parser.parse_args()
    from edge_runtime.generation.model import load_generative

    args.models.mkdir(parents=True, exist_ok=True)
    folder = fused_folder(args.models)
    prompt = [int(t) for t in np.random.default_rng(0).integers(10, SPEC.vocab, 64)]
    with tempfile.TemporaryDirectory(prefix="bench-token-loop-") as work:
        repository = Path(work) / "repository"
        (repository / MODEL).mkdir(parents=True)
        (repository / MODEL / "1").symlink_to(folder, target_is_directory=True)
        server = ServerProcess.start(repository, Path(work) / "serve.log", timeout_s=300,
                                     env={"EDGE_RUNTIME_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)})
        model = load_generative(folder, MODEL, threads=args.threads)
        try:
            results = asyncio.run(rounds(model, server.url, prompt, args))
            parts = breakdown(model, prompt, args.new_tokens, args.rounds)
        finally:
            model.close()
            server.stop()
    best = {name: max(r["decode_tokens_per_s"] for r in runs) for name, runs in results.items()}
    summary = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
               "model": {"hidden": SPEC.hidden, "layers": SPEC.layers, "heads": SPEC.heads, "kv_heads": SPEC.kv_heads,
                         "vocab": SPEC.vocab, "dtype": "fp32", "graph": "fused (GroupQueryAttention, KV in place)"},
               "threads": args.threads, "prompt_tokens": len(prompt), "new_tokens": args.new_tokens,
               "rounds": results, "best_decode_tokens_per_s": best,
               "http_vs_in_process": round(best["http"] / best["in_process"], 3),
               "in_process_breakdown": parts, "sse_event_encode_us": sse_encode_us()}
    publish(summary, args.out, "bench_token_loop", _plot)
    return 0


def _plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    best = summary["best_decode_tokens_per_s"]
    left.bar(list(best), list(best.values()), color=["tab:blue", "tab:orange"])
    left.set_ylabel("decode tokens/s (best of rounds)")
    left.set_title(f"HTTP / in-process = {summary['http_vs_in_process']:.2f}")
    parts = summary["in_process_breakdown"]["parts_us"]
    right.barh(list(parts), list(parts.values()))
    right.set_xscale("log")
    right.set_xlabel("microseconds per decode step (in-process, probed)")
    right.set_title("where a step goes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
