"""The fp32 arithmetic floor of a VLM agent step: the least time any fp32 engine could take here.

A step must encode its new screenshots and prefill the prompt tokens no cache holds. Their
matrix multiply-adds are counted — the vision tower by PyTorch's ``FlopCounterMode`` running
transformers' own tower (eager attention for the count: its CPU SDPA kernel is not among the ops
the counter knows; every patch attends to every patch), the text prefill from the decoder's
linear weights (each new token through every layer), causal attention (each new token against the
cached ones and the new ones before it) and the LM head at the last position — and divided by the
best fp32 GEMM rate measured on this machine with the same threads (ONNX Runtime's MatMul and
PyTorch's ``mm``, 2048x2048x2048). So the floor assumes peak GEMM speed throughout and no
element-wise work or memory traffic: no fp32 engine reaches it.

``tools/bench_vlm.py`` reports it per step beside transformers' time to first token: where the
floor is above half of transformers' time, issue 22's goal (<= 0.5x) cannot be met in fp32 on
this machine by any engine doing the step's arithmetic.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

GEMM_N = 2048


def gemm_peak_gflops(threads: int, rounds: int = 5, repeat: int = 4, n: int = GEMM_N) -> dict[str, float]:
    """GFLOP/s of an fp32 ``n``^3 matrix product, best of ``rounds`` alternated rounds per engine."""
    import torch

    from bench_matmul_rows import matmul_model, session

    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    gemm = session(matmul_model(n, n), threads)  # ONNX Runtime's MatMul on a constant weight
    b = torch.from_numpy(np.random.default_rng(1).random((n, n), dtype=np.float32))
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    ta = torch.from_numpy(a)
    runs = {"onnxruntime": lambda: gemm.run(None, {"X": a}), "torch": lambda: ta @ b}
    best = dict.fromkeys(runs, float("inf"))
    try:
        for _ in range(rounds):
            for name, run in runs.items():
                run()  # warm: packing, first-touch of the output
                started = time.perf_counter()
                for _ in range(repeat):
                    run()
                best[name] = min(best[name], (time.perf_counter() - started) / repeat)
    finally:
        torch.set_num_threads(torch_threads)
    return {name: round(2 * n ** 3 / seconds / 1e9, 1) for name, seconds in best.items()}


def vision_flops(model: Any, pixel_values: Any, grid_thw: Any) -> int:
    """FLOPs of transformers' vision tower (``get_image_features``) over these pixels, attention included."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    before = model.config._attn_implementation
    model.set_attn_implementation("eager")  # matmuls the counter sees (SDPA's CPU kernel it does not count)
    try:
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:
            model.model.get_image_features(pixel_values, grid_thw)
    finally:
        model.set_attn_implementation(before)
    return int(counter.get_total_flops())


def text_linear_macs(model: Any) -> int:
    """Multiply-adds of one token through the text decoder's layers: every ``nn.Linear`` weight once."""
    import torch

    layers = model.model.language_model.layers
    return sum(m.weight.numel() for m in layers.modules() if isinstance(m, torch.nn.Linear))


def text_prefill_flops(model: Any, new: int, past: int) -> int:
    """FLOPs of prefilling ``new`` tokens after ``past`` cached ones: linear layers, causal attention
    (new token ``i`` scores ``past + i + 1`` keys and sums as many values) and the LM head at the last."""
    text = model.config.text_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    keys = new * past + new * (new + 1) // 2  # (query, key) pairs the causal mask keeps
    attention = 2 * text.num_hidden_layers * text.num_attention_heads * head_dim * keys
    return 2 * (new * text_linear_macs(model) + attention + text.hidden_size * text.vocab_size)


def floor_ms(flops: float, gflops: dict[str, float]) -> float:
    """``flops`` at the best of the measured GEMM rates, in ms."""
    return flops / (max(gflops.values()) * 1e9) * 1e3
