"""Driver canary: a first use of a device runs a small GEMM in a subprocess.

Broken OpenCL drivers crash (SIGSEGV) or hang inside clBuildProgram or the
first kernel; running the first build and GEMM in a child process with a
timeout keeps such a driver from taking the runtime down. The verdict is
stored per (device, driver version, fingerprint) in
``cache_dir/opencl/canary.json`` (in memory without a cache dir); a device
that failed stays unusable until the driver or the fingerprint changes, or
the entry is deleted.

Run as ``python -m backends.opencl.canary``: prints one JSON line
``{"ok": bool, "reason": str, ...}``. Test hook: the environment variable
``EDGE_RUNTIME_OPENCL_CANARY_FAULT`` = ``crash`` | ``hang`` | ``wrong`` is read
only here, in the child, to simulate a broken driver.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from backends.opencl.device import DeviceInfo

log = logging.getLogger(__name__)

FAULT_ENV = "EDGE_RUNTIME_OPENCL_CANARY_FAULT"
_PROJECT_ROOT = Path(__file__).resolve().parents[2]
_memo: dict[tuple[str, str], "CanaryResult"] = {}
_memo_lock = threading.Lock()


@dataclass(frozen=True)
class CanaryResult:
    ok: bool
    reason: str


def canary_key(info: DeviceInfo) -> str:
    """Device identity + pyopencl version + hash of the canary and the kernel it runs."""
    import pyopencl

    from backends.opencl.source import family_digest

    own = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    return f"{info.cache_identity}|pyopencl {pyopencl.VERSION_TEXT}|canary {own}|gemm {family_digest('gemm')}"


def check_device(info: DeviceInfo, cache_root: Path | None, timeout_s: float) -> CanaryResult:
    """The canary verdict for ``info``, running the child process only the first time."""
    key = canary_key(info)
    memo_key = (str(cache_root or ""), key)
    with _memo_lock:
        if memo_key in _memo:
            return _memo[memo_key]
        path = cache_root / "canary.json" if cache_root is not None else None
        stored = _load(path).get(key) if path is not None else None
        if stored is not None:
            result = CanaryResult(bool(stored.get("ok")), str(stored.get("reason", "")))
        else:
            result = _run_child(timeout_s)
            log.info("opencl: canary on %r: %s", info.name, result)
            if path is not None:
                _store(path, key, result)
        _memo[memo_key] = result
        return result


def _run_child(timeout_s: float) -> CanaryResult:
    started = time.perf_counter()
    try:
        # cwd: ``-m`` then finds this package whether installed or run from a checkout.
        done = subprocess.run([sys.executable, "-m", "backends.opencl.canary"], cwd=str(_PROJECT_ROOT),
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return CanaryResult(False, f"canary hung: no answer within {timeout_s:g} s")
    except OSError as exc:
        return CanaryResult(False, f"canary could not start: {exc}")
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        return CanaryResult(False, f"canary crashed with {name}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    try:
        verdict = json.loads(lines[-1]) if lines else {}
    except ValueError:
        verdict = {}
    if done.returncode == 0 and verdict.get("ok"):
        return CanaryResult(True, f"canary passed in {time.perf_counter() - started:.1f} s")
    reason = verdict.get("reason") or (done.stderr.strip().splitlines() or ["no output"])[-1]
    return CanaryResult(False, f"canary failed (exit {done.returncode}): {reason}")


def _load(path: Path) -> dict[str, dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("opencl: ignoring unreadable canary file %s: %s", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def _store(path: Path, key: str, result: CanaryResult) -> None:
    try:
        data = _load(path)
        data[key] = {"ok": result.ok, "reason": result.reason, "checked_at": time.time()}
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("opencl: cannot write canary file %s: %s", path, exc)


def _child() -> dict[str, object]:
    """Build gemm.cl, multiply 37x45 by 45x29 and compare with numpy."""
    import numpy as np
    import pyopencl as cl

    from backends.opencl.device import shared_device
    from backends.opencl.lowering.context import ceil_div
    from backends.opencl.lowering.linear import GemmShape, gemm_defines
    from backends.opencl.source import Instance, assemble, kernel_name

    fault = os.environ.get(FAULT_ENV, "")
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "hang":
        time.sleep(3600)
    m, n, k, tm, tn = 37, 29, 45, 4, 8
    handle = shared_device()
    rng = np.random.default_rng(7)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    defines = gemm_defines(GemmShape(m=m, n=n, k=k, sam=k, sak=1, sbk=n, sbn=1), (("ACTIVATE(v)", "(v)"),))
    source = assemble([Instance("gemm", "gemm", tuple(defines + [("TM", str(tm)), ("TN", str(tn))]))])
    program = cl.Program(handle.context, source).build()
    queue = handle.new_queue()
    flags = cl.mem_flags
    a_buf = cl.Buffer(handle.context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=a)
    b_buf = cl.Buffer(handle.context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=b)
    y_buf = cl.Buffer(handle.context, flags.WRITE_ONLY, m * n * 4)
    kernel = cl.Kernel(program, kernel_name("gemm", 0))
    kernel.set_args(a_buf, b_buf, y_buf)
    cl.enqueue_nd_range_kernel(queue, kernel, (ceil_div(n, tn), ceil_div(m, tm), 1), None)
    y = np.empty((m, n), np.float32)
    cl.enqueue_copy(queue, y, y_buf)
    queue.finish()
    if fault == "wrong":
        y += 1.0
    error = float(np.max(np.abs(y - a @ b)) / max(float(np.max(np.abs(a @ b))), 1e-30))
    ok = error < 1e-4
    return {"ok": ok, "device": handle.info.name, "relative_error": error,
            "reason": "" if ok else f"GEMM result differs from numpy (relative error {error:.3g})"}


def main() -> int:
    try:
        verdict = _child()
    except Exception as exc:  # any failure in the child is the verdict itself
        verdict = {"ok": False, "reason": f"{type(exc).__name__}: {exc}"[:500]}
    sys.stdout.write(json.dumps(verdict) + "\n")
    return 0 if verdict.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
