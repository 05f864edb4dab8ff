"""A real daemon serving the PP-OCR classifier on its default configuration, with PoCL installed.

No ``[serving] backend`` pinned: ``auto`` measures its candidates (the race runs in a child
process) and serves the winner. The oracle for "CPU-winning" is that measurement itself,
read back from the model's metadata (``auto_decision``), and for "maps no GPU driver" the
daemon's own ``/proc/<pid>/maps``. Three copies of the model cover what users write:
nothing (``plain``), a non-fixed scheduler policy (``cost``: the factory adds only plans
measured within the margin), and batching alone (``batched``: the experiment waits for the
first request's shapes; the classifier's pooling rejects the 1x1 and 32x32 images the old
warm-up and probe made up, and each was a plan-fallback WARNING at every start).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import numpy as np
import pytest

from edge_runtime.protocol import codec
from server_fixtures import ROOT, free_port, ort_run

sys.path.insert(0, str(ROOT / "tools"))
from ocr_models import ocr_models  # noqa: E402  (tools/ is not a package)

GPU_DRIVER_LIBRARIES = ("libpocl", "libLLVM", "libclang", "libOpenCL", "libvulkan")
CONFIGS = {"plain": "", "cost": '[scheduler]\npolicy = "cost"\n', "batched": "[batching]\nmax_batch_size = 16\n"}
READY_S = 600  # the race compiles PoCL kernels in its child: minutes on a loaded 2-core box
CLS_SHAPE = (1, 3, 48, 192)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    model = ocr_models().get("cls")
    if model is None:
        pytest.fail("rapidocr-onnxruntime (a test dependency) ships no PP-OCR classifier")
    root = tmp_path_factory.mktemp("default-config")
    for name, config in CONFIGS.items():
        (root / "repository" / name / "1").mkdir(parents=True)
        (root / "repository" / name / "1" / "model.onnx").write_bytes(model.read_bytes())
        if config:
            (root / "repository" / name / "config.toml").write_text(config)
    port = free_port()
    env = {**os.environ, "EDGE_RUNTIME_CACHE": str(root / "cache"), "PYTHONPATH": str(ROOT)}
    env.pop("EDGE_RUNTIME_BACKENDS", None)
    # The default log level (WARNING): what a user starting the daemon sees.
    process = subprocess.Popen([sys.executable, "-m", "edge_runtime", "serve", "--port", str(port),
                                "--model-repository", str(root / "repository")],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield process, f"http://127.0.0.1:{port}", model
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


async def _wait_ready(session: aiohttp.ClientSession, base: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1][-3000:]
        try:
            async with session.get(f"{base}/v2/health/ready") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.5)
    raise AssertionError(f"daemon not ready within {READY_S} s")


def _mapped_drivers(pid: int) -> list[str]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return sorted({lib for lib in GPU_DRIVER_LIBRARIES if f"/{lib}" in maps})


@pytest.mark.requires_opencl
async def test_cpu_winning_models_map_no_gpu_driver_and_start_without_warnings(daemon: Any) -> None:
    process, base, model = daemon
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await _wait_ready(session, base, process)
        metadata = {}
        for name in CONFIGS:
            async with session.get(f"{base}/v2/models/{name}") as response:
                metadata[name] = (await response.json())["edge_runtime"]
        decision = metadata["plain"]["auto_decision"]
        assert decision is not None, "auto did not measure its candidates"
        timed = {c["name"]: c["measured_ms"] for c in decision["candidates"] if c["measured_ms"] is not None}
        assert any(c["backends"] and set(c["backends"]) != {"cpu"} for c in decision["candidates"]), \
            f"no accelerator candidate raced (is PoCL installed?): {decision}"
        assert decision["winner"] == "cpu", f"premise: ONNX Runtime measured fastest on the classifier: {timed}"
        for name in CONFIGS:
            assert metadata[name]["backend"] == "cpu"
        # The cost policy keeps only plans measured within the margin of the winner; here none is.
        margin_plans = {c["name"] for c in decision["candidates"] if c["measured_ms"] is not None
                        and c["measured_ms"] <= 1.3 * timed["cpu"]} & {"gpu", "hybrid"}
        assert set(metadata["cost"]["plans"]) == {"cpu"} | margin_plans, (metadata["cost"]["plans"], timed)
        if not margin_plans:
            assert _mapped_drivers(process.pid) == [], "a daemon serving CPU-winning models maps a GPU driver"
        assert metadata["batched"]["batching"]["deferred"] is True

        # The first real request sets the shapes; the deferred probe then turns batching on.
        x = np.random.default_rng(0).random(CLS_SHAPE, dtype=np.float32)
        async with session.post(f"{base}/v2/models/batched/infer",
                                data=codec.encode_request({"x": x}).body) as response:
            assert response.status == 200, await response.text()
            document = await response.json()
        got = np.asarray(document["outputs"][0]["data"], np.float32).reshape(1, 2)
        np.testing.assert_allclose(got, next(iter(ort_run(model, {"x": x}).values())), rtol=1e-4, atol=1e-5)
        for _ in range(600):
            async with session.get(f"{base}/v2/models/batched") as response:
                batching = (await response.json())["edge_runtime"]["batching"]
            if batching["enabled"] or not batching["deferred"]:
                break
            await asyncio.sleep(0.05)
        assert batching["enabled"], batching
        if not margin_plans:
            assert _mapped_drivers(process.pid) == []
    process.terminate()
    stderr = process.communicate(timeout=60)[1]
    warnings = [line for line in stderr.splitlines()
                if (" WARNING " in line or " ERROR " in line) and "edge_runtime.server.daemon" not in line]
    assert warnings == [], "\n".join(warnings)
