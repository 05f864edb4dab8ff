"""``auto`` races in a child process: a process whose model ends up on the CPU never maps PoCL.

Each check runs a fresh interpreter (this test process may have PoCL mapped by
other tests), loads a model on the default configuration and reports its own
``/proc/self/maps``. The MLP is far too small to pay for a device's launches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.requires_opencl

_SCRIPT = r"""
import json, logging, sys
from pathlib import Path
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.name, record.getMessage()))
logging.getLogger().addHandler(Keep()); logging.getLogger().setLevel(logging.INFO)
from edge_runtime.config import RuntimeConfig
from edge_runtime.runtime import Runtime
rt = Runtime(RuntimeConfig(cache_dir=Path(sys.argv[2])))
model = rt.load(sys.argv[1])
maps = Path("/proc/self/maps").read_text()
print(json.dumps({"backend": model.backend, "decision": model.describe().get("auto_decision"),
                  "pocl_mapped": "libpocl" in maps or "libOpenCL" in maps, "pyopencl": "pyopencl" in sys.modules,
                  "warnings": [r for r in records if r[0] in ("WARNING", "ERROR")]}))
"""


def _load_in_fresh_process(model: Path, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(model), str(cache)], capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ppocr_classifier() -> Path | None:
    """The PP-OCR direction classifier shipped in the ``rapidocr-onnxruntime`` wheel (a test extra)."""
    import importlib.util

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted((Path(list(spec.submodule_search_locations)[0]) / "models").glob("*_cls_*.onnx"))
    return found[0] if found else None


@pytest.mark.parametrize("kind", ["mlp", "ppocr_cls"])
def test_a_cpu_winning_model_never_maps_the_gpu_driver(tmp_path: Path, kind: str) -> None:
    """The MLP; and the PP-OCR classifier, which the fused calibration put wholly on PoCL (1.6x slower)."""
    from edge_runtime.model_zoo import build_mlp

    if kind == "mlp":
        path = tmp_path / "mlp.onnx"
        onnx.save(build_mlp(), str(path))
    else:
        path = _ppocr_classifier()
        if path is None:
            if os.environ.get("CI") == "true":
                pytest.fail("rapidocr-onnxruntime (test extra) must be installed under CI=true")
            pytest.skip("rapidocr-onnxruntime (test extra) is not installed")
    first = _load_in_fresh_process(path, tmp_path / "cache")
    decision = first["decision"]
    assert first["backend"] == "cpu" and decision["winner"] == "cpu", decision
    assert decision["where"] == "child"
    raced = {c["name"]: c for c in decision["candidates"]}
    assert "opencl" in raced["gpu"]["backends"], "the child did consider PoCL"
    assert not first["pocl_mapped"] and not first["pyopencl"], "the parent never loaded the driver"
    assert first["warnings"] == []
    again = _load_in_fresh_process(path, tmp_path / "cache")
    assert again["decision"]["where"] == "cache" and again["backend"] == "cpu"
    assert not again["pocl_mapped"] and again["warnings"] == []


def test_a_race_child_that_fails_leaves_the_model_on_cpu_and_caches_nothing(tmp_path: Path, monkeypatch,
                                                                            caplog) -> None:
    """The child cannot read the model (gone after the parent parsed it): cpu, a WARNING, no cache entry."""
    import logging

    from edge_runtime import plan_choice
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.model_zoo import build_mlp
    from edge_runtime.runtime import Runtime

    monkeypatch.setattr(plan_choice, "gpu_driver_loaded", lambda: False)  # other tests may have mapped PoCL here
    rt = Runtime(RuntimeConfig(cache_dir=tmp_path / "cache", backend_order=("opencl", "cpu"), probe_opencl=False))
    proto = build_mlp()
    with caplog.at_level(logging.WARNING, logger="edge_runtime.plan_choice"):
        decision = plan_choice.decide_plan(rt, tmp_path / "gone.onnx", proto, rt.compile_options(), None)
    assert decision is not None and decision.winner == "cpu" and "race failed" in decision.reason
    assert "race child" in caplog.text and "gone.onnx" in caplog.text
    assert not (tmp_path / "cache" / plan_choice.CACHE_FILE).exists(), "a failure is not remembered"
    rt.close()
