"""ONNX Runtime's WebGPU execution provider (Dawn on Vulkan): registration, sessions, placement.

The EP ships as a plugin library (``onnxruntime-ep-webgpu``) registered once per
process. ``placement`` answers which nodes the EP really takes: a session is
created (nothing runs, no shader compiles) with ONNX Runtime's record of the
EP assignment switched on, so ``supports()`` reports the EP's own choice, not
a hand-written op list.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx
    import onnxruntime

log = logging.getLogger(__name__)

EP_NAME = "WebGpuExecutionProvider"
MIN_ORT = (1, 24)
# Dawn picks its backend by this EP option; Vulkan is the one this backend promises.
EP_OPTIONS = {"dawnBackendType": "Vulkan"}
_lock = threading.Lock()
_registered: dict[str, bool] = {}


def ep_device() -> "onnxruntime.OrtEpDevice":
    """The WebGPU EP device, registering the plugin on first call; raises RuntimeError saying why not."""
    import onnxruntime as ort
    import onnxruntime_ep_webgpu

    version = tuple(int(p) for p in ort.__version__.split(".")[:2])
    if version < MIN_ORT:
        raise RuntimeError(f"onnxruntime {ort.__version__} is too old for the WebGPU EP plugin (needs >= 1.24)")
    with _lock:
        if not _registered.get("webgpu"):
            ort.register_execution_provider_library("webgpu", onnxruntime_ep_webgpu.get_library_path())
            _registered["webgpu"] = True
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    if not devices:
        raise RuntimeError("ONNX Runtime offers no WebGPU device (it looks for GPUs in /sys/class/drm/card*)")
    return devices[0]


def session_options(threads: int | None, record_placement: bool, cpu_fallback: bool = True,
                    optimise: bool = True) -> "onnxruntime.SessionOptions":
    """Session options on the WebGPU device; ``record_placement`` keeps ORT's node assignment."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # Dawn's limit notices are warnings on every session
    if threads:
        options.intra_op_num_threads = threads
    if record_placement:
        options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if not cpu_fallback:
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if not optimise:
        # Basic level only (constant folding, no fusion): node names stay those of the model, so
        # the assignment maps back onto its nodes; folded shape arithmetic simply disappears.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.add_provider_for_devices([ep_device()], dict(EP_OPTIONS))
    return options


def assignment(session: "onnxruntime.InferenceSession") -> dict[str, str]:
    """``{node name: EP name}`` as ONNX Runtime placed the session's (possibly optimised) graph."""
    return {node.name: info.ep_name for info in session.get_provider_graph_assignment_info()
            for node in info.get_nodes()}


def host_placed(model: "onnx.ModelProto") -> set[str]:
    """Names of the model's nodes ONNX Runtime puts on its CPU EP beside the WebGPU EP.

    The graph is constant-folded first, as a compile would: shape arithmetic
    that folds away (static shapes) is compiled by the EP, not placed anywhere.
    """
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), session_options(1, True, optimise=False))
    return {name for name, ep in assignment(session).items() if ep != EP_NAME}


def takes_alone(model: "onnx.ModelProto") -> bool:
    """Whether the EP takes every node of a (one-node) model with CPU fallback disabled."""
    import onnxruntime as ort

    try:
        ort.InferenceSession(model.SerializeToString(), session_options(1, False, cpu_fallback=False, optimise=False))
    except Exception as exc:  # ORT's Fail/InvalidGraph/NotImplemented have no common base to name
        log.debug("webgpu refuses %s: %s", [n.op_type for n in model.graph.node], str(exc).splitlines()[0][:200])
        return False
    return True


def describe_device(device: Any) -> dict[str, Any]:
    """What ONNX Runtime says of its EP device (the adapter itself is Dawn's choice)."""
    return {"ep": device.ep_name, "ep_version": dict(device.ep_metadata).get("version"),
            "hardware_device_type": str(device.device.type).rsplit(".", 1)[-1].lower(),
            "hardware_vendor_id": device.device.vendor_id}
