"""An ONNX model on the WebGPU EP (Dawn on Vulkan), with ORT's CPU EP for what the EP leaves."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping

from backends.base import CompileOptions, TensorSpec
from backends.errors import BackendError, ModelLoadError
from backends.onnx_graph import graph_inputs, graph_outputs
from backends.vulkan import webgpu
from backends.vulkan.precision import measure_drift, to_fp16

if TYPE_CHECKING:
    import numpy as np
    import onnx

log = logging.getLogger(__name__)


def compile_onnx(proto: "onnx.ModelProto", options: CompileOptions, device: dict[str, Any]) -> "WebGpuExecutable":
    """A session on the WebGPU EP; raises ModelLoadError when ONNX Runtime cannot build it."""
    import onnxruntime as ort

    source = to_fp16(proto) if options.precision == "fp16" else proto
    try:
        session = ort.InferenceSession(source.SerializeToString(),
                                       webgpu.session_options(options.intra_op_threads, True))
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
        raise ModelLoadError(f"vulkan: onnxruntime (WebGPU EP) cannot load the model: {exc}") from exc
    placed = webgpu.assignment(session)
    names = {n.name for n in proto.graph.node}
    on_host = sum(1 for name, ep in placed.items() if ep != webgpu.EP_NAME and name in names)
    executable = WebGpuExecutable(session, graph_inputs(proto), graph_outputs(proto), device, options.precision,
                                  {"vulkan": len(proto.graph.node) - on_host, **({"cpu": on_host} if on_host else {})})
    if options.precision == "fp16":
        executable.drift = measure_drift(proto, executable.run)
    return executable


class WebGpuExecutable:
    """An ``onnxruntime.InferenceSession`` on the WebGPU EP behind the Executable contract.

    ``backend_nodes``: the model's nodes by where ORT placed them; nodes fused
    or folded by ORT's optimiser count under ``vulkan`` (the EP compiled
    them), nodes ORT kept on its CPU EP (shape arithmetic, refused ops) under
    ``cpu``.
    """

    thread_safe = False  # one Dawn queue per session: the Model lock serialises runs

    def __init__(self, session: Any, inputs: list[TensorSpec], outputs: list[TensorSpec], device: dict[str, Any],
                 precision: str, backend_nodes: dict[str, int]) -> None:
        self._session = session
        self.inputs = inputs
        self.outputs = outputs
        self.backend_nodes = backend_nodes
        self.device = "gpu"
        self.drift: dict[str, Any] | None = None
        self._names = [s.name for s in outputs]
        self._device = device
        self._precision = precision

    def run(self, feeds: Mapping[str, "np.ndarray"]) -> dict[str, "np.ndarray"]:
        if self._session is None:
            raise BackendError("vulkan: executable is closed")
        try:
            values = self._session.run(self._names, dict(feeds))
        except Exception as exc:  # ORT's runtime errors have no common base we can name
            raise BackendError(f"vulkan: onnxruntime (WebGPU EP) run failed: {exc}") from exc
        return dict(zip(self._names, values))

    def describe(self) -> dict[str, Any]:
        providers = self._session.get_providers() if self._session is not None else []
        return {"backend": "vulkan", "engine": "onnxruntime WebGPU EP (Dawn, Vulkan backend)",
                **self._device, "providers": providers,
                "precision": {"mode": self._precision, **({"drift": self.drift} if self.drift else {})}}

    def close(self) -> None:
        self._session = None
