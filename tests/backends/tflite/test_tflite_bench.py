"""``tools/bench_tflite.py`` runs end to end, bounded, and reports ratios it computed from its own timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench_tflite

pytestmark = pytest.mark.requires_litert


def test_bench_reports_ratios(tflite_models: dict[str, Path], tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "bench.png"
    bench_tflite.main(["--no-generated", "--model", str(tflite_models["float_cnn"]), "--runs", "20",
                       "--seconds", "2", "--plot", str(plot)])
    report = json.loads(capsys.readouterr().out)
    (result,) = report["results"]
    assert result["model"] == "float_cnn.tflite" and 20 <= result["runs"] <= 25
    assert result["plain_ms_p50"] > 0 and result["ours_ms_p50"] > 0
    assert report["ratio_median"] == result["ratio"] > 0 and result["control_ratio"] > 0
    assert report["overhead_probe"]["model"] == "tiny_add_mul.tflite"
    assert plot.stat().st_size > 1000 and plot.read_bytes()[:4] == b"\x89PNG"
