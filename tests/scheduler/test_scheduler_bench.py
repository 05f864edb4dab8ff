"""Smoke test of ``tools/bench_scheduler.py``'s batching part: it runs and reports coherent figures.

Speed is not asserted (benchmarks measure, tests check behaviour); the batch
sizes it reports are: with 16 clients and batching on, some runs carry more
than one request, and without batching none does.
"""

from __future__ import annotations

from pathlib import Path

import onnx


async def test_batching_benchmark_reports_every_mode(tmp_path: Path, mlp_proto) -> None:
    from bench_scheduler import bench_batching

    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_proto, str(path))
    rt = Runtime(RuntimeConfig(cache_dir=tmp_path / "cache", probe_opencl=False))
    try:
        report = await bench_batching(rt, {"mlp": path}, seconds=0.1, delay_us=2000, rounds=2)
    finally:
        rt.close()
    row = report["mlp"]
    for clients in ("concurrency_16", "concurrency_1"):
        assert {"plain_onnxruntime", "no_batching", "batching", "batching_nospin"} <= set(row[clients])
        assert all(mode["throughput_rps"] > 0 and mode["n"] > 0 for mode in row[clients].values())
    assert set(row["concurrency_16"]["no_batching"]["batch_sizes"]) == {"1"}
    assert max(int(size) for size in row["concurrency_16"]["batching"]["batch_sizes"]) > 1
    assert row["throughput_ratio_batching_vs_no_batching"] > 0
    assert isinstance(row["concurrency_1_within_delay_plus_noise"], bool)
    assert set(row["configurations"]) == {"no_batching", "batching", "batching_nospin"}
    assert row["configurations"]["no_batching"]["batching_gain"] == 1.0
    assert all(entry["cpu_share_loaded"] > 0 for entry in row["configurations"].values())
    assert row["ort_best_batch_rows_per_s"] > 0 and row["cpu_share_idle"] >= 0
