"""``VulkanBackend``: availability, node claims and compilation for the ``vulkan`` backend.

Devices come from the Vulkan loader (``device_profiles.vulkan_loader``, in a
child process). A hardware device is preferred; a software one (lavapipe,
llvmpipe, SwiftShader: ``VK_PHYSICAL_DEVICE_TYPE_CPU``) is used only because
this backend was asked for by name: the catalogue never puts ``vulkan`` in the
automatic order of a device whose only Vulkan devices are software, and only
then does the backend set ONNX Runtime's software-adapter switch. Before the
first in-process use, a canary child runs a tiny model on the device; a
crashing, hanging or wrong driver makes the backend unavailable and the
runtime keeps serving on ``cpu``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from backends.base import Availability, CompileOptions, ModelSource, TensorSpec
from backends.errors import BackendUnavailableError
from backends.vulkan import driver_env

if TYPE_CHECKING:
    import onnx

    from backends.vulkan.placement import Placement

log = logging.getLogger(__name__)

CANARY_TIMEOUT_S = 300.0  # a first shader compile on lavapipe under load takes minutes
TFLITE_SUFFIXES = (".tflite", ".lite")


class VulkanBackend:
    """ONNX on ONNX Runtime's WebGPU EP, ``.tflite`` on LiteRT's GPU accelerator, both on Vulkan via Dawn."""

    name = "vulkan"

    def __init__(self, *, cache_dir: Path | None = None, canary_timeout_s: float = CANARY_TIMEOUT_S) -> None:
        # NOTE: before anything can load a Vulkan driver in this process (see driver_env).
        self.shader_cache = driver_env.prepare_shader_cache(cache_dir)
        self._canary_timeout_s = canary_timeout_s
        self._availability: Availability | None = None
        self._device: dict[str, Any] = {}
        self._placement: Placement | None = None

    def availability(self) -> Availability:
        if self._availability is None:
            self._availability = self._check()
        return self._availability

    def _check(self) -> Availability:
        try:
            import onnxruntime  # noqa: F401
            import onnxruntime_ep_webgpu  # noqa: F401
        except ImportError as exc:
            return Availability.no(f"the WebGPU EP plugin is not importable (pip install onnxruntime-ep-webgpu): {exc}")
        from device_profiles.vulkan_loader import query_devices

        devices, note = query_devices(env=driver_env.child_env(False))
        if devices is None:
            return Availability.no(note)
        if not devices:
            return Availability.no("the Vulkan loader lists no physical device")
        hardware = [d for d in devices if d["type"] != "cpu"]
        chosen = (hardware or devices)[0]
        software = not hardware
        if software:
            driver_env.allow_software_adapter()  # only now: a software device, asked for by name
        from backends.vulkan import canary

        verdict = canary.check(repr(devices), driver_env.child_env(software), self._canary_timeout_s)
        if not verdict.ok:
            return Availability.no(verdict.reason)
        self._device = {"adapter": chosen["name"], "adapter_type": chosen["type"], "software": software,
                        "driver": chosen.get("driver"), "driver_info": chosen.get("driver_info"),
                        "api": f"Vulkan {chosen.get('api_version')} via Dawn (WebGPU)",
                        "shader_cache": self.shader_cache.to_dict()}
        kind = "software Vulkan device, used because asked for by name" if software else chosen["type"]
        return Availability.yes(f"{chosen['name']} ({kind}; {chosen.get('driver_info') or chosen.get('driver')})",
                                f"canary passed: {verdict.reason}")

    def _require(self) -> None:
        availability = self.availability()
        if not availability.ok:
            raise BackendUnavailableError(f"vulkan: {availability.reason}")

    def _placer(self) -> "Placement":
        self._require()
        if self._placement is None:
            from backends.vulkan.placement import Placement

            self._placement = Placement()
        return self._placement

    def supports(self, node: "onnx.NodeProto", shapes: Mapping[str, TensorSpec]) -> bool:
        """Whether the WebGPU EP takes ``node`` alone (asked of the EP; see backends.vulkan.placement)."""
        return self._placer().supports(node, shapes)

    def claims(self, model: "onnx.ModelProto", shapes: Mapping[str, TensorSpec]) -> frozenset[int]:
        """(optional hook) Indices of the model's nodes the EP takes, from ORT's own assignment."""
        return self._placer().claims(model, shapes)

    def compile(self, model: ModelSource, options: CompileOptions) -> Any:
        self._require()
        if isinstance(model, (str, Path)) and str(model).lower().endswith(TFLITE_SUFFIXES):
            from backends.vulkan.litert_executable import compile_tflite

            return compile_tflite(Path(model), options, self.describe_device())
        from backends.onnx_graph import load_onnx
        from backends.vulkan.onnx_executable import compile_onnx

        return compile_onnx(load_onnx(model), options, self.describe_device())

    def describe_device(self) -> dict[str, Any]:
        """Adapter, driver, API and shader cache of the device in use (empty before availability())."""
        return dict(self._device)
