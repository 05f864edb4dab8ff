"""``edge-runtime demo``: the embedded MobileNet-style CNN on every available backend.

The model is built locally from a fixed seed (no download) and cached under
the cache directory. Every backend's output is compared with a plain ONNX
Runtime session on the same input, the baseline a user would pick instead.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.errors import EdgeRuntimeError

log = logging.getLogger(__name__)

DEMO_MODEL_VERSION = 1  # bump when model_zoo.build_mobilenet changes


def demo_model_path(cache_dir: Path) -> Path:
    """Path of the demo model, building and caching it on first use."""
    path = Path(cache_dir) / "models" / f"demo-mobilenet-v{DEMO_MODEL_VERSION}.onnx"
    if not path.is_file():
        import onnx

        from edge_runtime.model_zoo import build_mobilenet

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        onnx.save(build_mobilenet(), str(tmp))
        tmp.replace(path)  # atomic: a concurrent demo never reads half a file
    return path


def run_demo(repeat: int = 30, runtime: Any = None) -> tuple[list[dict[str, Any]], str]:
    """Rows of backend, availability, p50/p95 ms and max |diff| vs ORT; and the auto choice."""
    import onnxruntime as ort

    from backends.onnx_graph import graph_inputs, load_onnx
    from backends.descriptors import DESCRIPTORS
    from edge_runtime.backend_table import USER_BACKENDS
    from edge_runtime.feeds import random_feeds
    from edge_runtime.runtime import Runtime
    from edge_runtime.timing import measure_ms, summarise_ms

    runtime = runtime or Runtime()
    path = demo_model_path(runtime.config.cache_dir)
    baseline = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = random_feeds(graph_inputs(load_onnx(path)), seed=0)
    expected = baseline.run(None, feeds)[0]
    rows = [_row("onnxruntime (baseline)", "plain InferenceSession",
                 summarise_ms(measure_ms(lambda: baseline.run(None, feeds), repeat)), 0.0)]
    automatic = runtime.backend_order()
    for name in USER_BACKENDS:
        if name not in automatic:
            # e.g. vulkan on lavapipe only: a software device is used only when asked for by name.
            why = next((r for r in runtime.match.reasons if r.startswith(f"{name} dropped")), "not in the profile")
            rows.append(_row(name, f"not used automatically ({why}); try: edge-runtime run MODEL --backend {name}"))
            continue
        availability = runtime.availability(name)
        if not availability.ok:
            rows.append(_row(name, f"unavailable: {availability.reason}"))
            continue
        if not DESCRIPTORS[name].takes("onnx"):
            rows.append(_row(name, f"{availability.device}; runs .tflite models, the demo model is ONNX"))
            continue
        try:
            model = runtime.load(path, backend=name)
        except EdgeRuntimeError as exc:
            rows.append(_row(name, f"cannot load: {exc}"))
            continue
        output = next(iter(model.run(feeds).values()))
        latency = summarise_ms(measure_ms(lambda: model.run(feeds), repeat))
        rows.append(_row(name, availability.device, latency, float(np.max(np.abs(output - expected)))))
        model.close()
    chosen = runtime.load(path, backend="auto")
    auto = chosen.backend
    chosen.close()
    return rows, auto


def _row(backend: str, device: str, latency: dict[str, float] | None = None,
         max_abs_diff: float | None = None) -> dict[str, Any]:
    return {"backend": backend, "device": device,
            "p50_ms": latency["p50"] if latency else None,
            "p95_ms": latency["p95"] if latency else None,
            "max_abs_diff_vs_onnxruntime": max_abs_diff}


def format_table(rows: list[dict[str, Any]], auto_backend: str) -> str:
    header = f"{'backend':<24} {'p50 ms':>8} {'p95 ms':>8} {'max|diff|':>10}  device"
    lines = ["edge-runtime demo: MobileNet-style CNN, input [1, 3, 64, 64]", header, "-" * len(header)]
    for row in rows:
        p50 = "-" if row["p50_ms"] is None else f"{row['p50_ms']:.3f}"
        p95 = "-" if row["p95_ms"] is None else f"{row['p95_ms']:.3f}"
        diff = "-" if row["max_abs_diff_vs_onnxruntime"] is None else f"{row['max_abs_diff_vs_onnxruntime']:.2e}"
        lines.append(f"{row['backend']:<24} {p50:>8} {p95:>8} {diff:>10}  {row['device']}")
    lines.append(f"The probe would choose: {auto_backend}")
    return "\n".join(lines)
