"""Driver canary: the first use of the Vulkan backend runs a tiny model in a child process.

A broken Vulkan driver or Dawn build can crash (SIGSEGV, SIGILL) or hang the
process that loads it; the child registers the WebGPU EP, runs Conv→Relu on the
device and compares it with numpy, so the daemon learns "broken" without
dying. The verdict is memoised per process and per device list.

Run as ``python -m backends.vulkan.canary``: prints one JSON line
``{"ok": bool, "reason": str}``. Test hook: ``EDGE_RUNTIME_VULKAN_CANARY_FAULT``
= ``crash`` | ``hang`` | ``wrong`` is read only here, in the child.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)

FAULT_ENV = "EDGE_RUNTIME_VULKAN_CANARY_FAULT"
_memo: dict[str, "CanaryResult"] = {}
_memo_lock = threading.Lock()


@dataclass(frozen=True)
class CanaryResult:
    ok: bool
    reason: str


def check(key: str, env: dict[str, str], timeout_s: float) -> CanaryResult:
    """The canary verdict for ``key`` (the device list), running the child only the first time."""
    with _memo_lock:
        if key not in _memo:
            _memo[key] = _run_child(env, timeout_s)
            log.info("vulkan: canary: %s", _memo[key])
        return _memo[key]


def _run_child(env: dict[str, str], timeout_s: float) -> CanaryResult:
    try:
        done = subprocess.run([sys.executable, "-m", "backends.vulkan.canary"], capture_output=True, text=True,
                              timeout=timeout_s, check=False, env=env)
    except subprocess.TimeoutExpired:
        return CanaryResult(False, f"the Vulkan driver hung: no answer from the canary within {timeout_s:g} s")
    except OSError as exc:
        return CanaryResult(False, f"the Vulkan canary could not start: {exc}")
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        return CanaryResult(False, f"the Vulkan driver crashed the canary ({name})")
    try:
        verdict = json.loads(done.stdout.strip().splitlines()[-1])
        return CanaryResult(bool(verdict["ok"]), str(verdict["reason"]))
    except (ValueError, IndexError, KeyError):
        tail = (done.stderr or "").strip().splitlines()[-1:] or [""]
        return CanaryResult(False, f"the Vulkan canary exited with {done.returncode}: {tail[0][:200]}")


def _child() -> dict[str, object]:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from backends.vulkan import webgpu

    fault = os.environ.get(FAULT_ENV, "")
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "hang":
        threading.Event().wait()
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "canary", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    try:
        session = ort.InferenceSession(model.SerializeToString(), webgpu.session_options(1, False, cpu_fallback=False))
        got = session.run(None, {"x": x})[0]
    except Exception as exc:  # any failure of the EP or driver is the verdict, reported whole
        return {"ok": False, "reason": f"WebGPU EP on Vulkan failed: {str(exc).splitlines()[0][:300]}"}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    if fault == "wrong":
        got = got + 1.0
    error = float(np.max(np.abs(got - want)))
    if not error <= 1e-3:
        return {"ok": False, "reason": f"the Vulkan device computes wrong results (Conv max |diff| {error:.3g})"}
    return {"ok": True, "reason": f"Conv+Relu on the WebGPU EP matches the CPU (max |diff| {error:.2g})"}


if __name__ == "__main__":
    print(json.dumps(_child()))
