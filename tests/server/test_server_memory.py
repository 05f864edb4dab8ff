"""A daemon serving only CPU models keeps GPU drivers out of its address space, and reports its memory.

Oracle: the kernel's own ``/proc/<pid>/maps`` of a real ``python -m edge_runtime
serve`` process (the OpenCL probe runs, PoCL and lavapipe are installed in CI),
and ``/proc/<pid>/status`` for the resident size ``/metrics`` reports.
"""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from edge_runtime.model_zoo import build_mlp
from server_fixtures import free_port, write
from test_server_daemon import start_server, wait_ready
from test_server_metrics import samples, value

# Libraries of GPU drivers and their toolchains: ICD loaders, PoCL and the LLVM/clang it brings, Vulkan.
GPU_LIBRARY = re.compile(r"libOpenCL|libpocl|libLLVM|libclang|libvulkan|lvp_icd|libvulkan_lvp|libtensorflowlite_gpu",
                         re.IGNORECASE)


def _vm_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/maps (Linux only)")
async def test_a_cpu_only_daemon_maps_no_gpu_driver_and_reports_its_memory(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    write(repository / "mlp" / "1" / "model.onnx", build_mlp())
    (repository / "mlp" / "config.toml").write_text('[serving]\nbackend = "cpu"\n')
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = start_server(repository, tmp_path / "cache", port)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            await wait_ready(session, base, process)
            maps = Path(f"/proc/{process.pid}/maps").read_text()
            mapped = sorted({line.split()[-1] for line in maps.splitlines() if GPU_LIBRARY.search(line)})
            assert mapped == [], f"GPU driver libraries mapped into a CPU-only daemon: {mapped}"
            async with session.get(f"{base}/metrics") as response:
                found = samples(await response.text())
            rss = value(found, "process_resident_memory_bytes")
            assert rss is not None and 0.5 < rss / _vm_rss_bytes(process.pid) < 2.0
            model_bytes = value(found, "edge_runtime_model_memory_bytes", model="mlp", version="1")
            assert model_bytes is not None and model_bytes > 0
            async with session.get(f"{base}/v2/models/mlp/stats") as response:
                stats = (await response.json())["model_stats"][0]
            assert stats["memory_usage"] and stats["memory_usage"][0]["byte_size"] == model_bytes
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
