"""A ``.tflite`` model on LiteRT's GPU accelerator (WebGPU → Dawn → Vulkan) through ``CompiledModel``.

The accelerator (``libLiteRtWebGpuAccelerator.so``, in the ``ai-edge-litert``
wheel for Linux x86_64 and aarch64) is reachable only through ``CompiledModel``,
not through ``Interpreter`` + ``load_delegate``. Precision: fp32 unless the
caller asked for fp16 (LiteRT's GPU default is fp16; ``enforce_f32`` turns it off).
"""

from __future__ import annotations

import os
import platform
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from backends.base import CompileOptions, TensorSpec
from backends.errors import BackendError, BackendUnavailableError, ModelLoadError
from backends.vulkan.precision import DRIFT_SEED, drift_between


FIRST_RUN_REBUILDS = 2
_environment: list[Any] = []
_environment_lock = threading.Lock()


def _shared_environment() -> Any:
    """One LiteRT environment (and so one WebGPU device) for every compiled model of the process.

    NOTE: a second CompiledModel with an environment of its own fails its first run
    ("Failed to lock custom tensor buffer") in ai-edge-litert 2.3.
    """
    import ai_edge_litert
    from ai_edge_litert.environment import Environment, EnvironmentOptions

    with _environment_lock:
        if not _environment:
            runtime_path = os.path.dirname(os.path.abspath(ai_edge_litert.__file__))
            _environment.append(Environment.create(options=EnvironmentOptions(runtime_path=runtime_path)))
        return _environment[0]


def accelerator_usable(cpu_features: tuple[str, ...] | None) -> str | None:
    """Why LiteRT's GPU accelerator cannot run on this CPU, or None: the aarch64 build needs dotprod."""
    if platform.machine().lower() in ("aarch64", "arm64") and cpu_features is not None \
            and "dotprod" not in cpu_features:
        return "LiteRT's aarch64 GPU accelerator needs the asimddp (dotprod) CPU feature (SIGILL without it)"
    return None


def compile_tflite(path: Path, options: CompileOptions, device: dict[str, Any]) -> "LiteRtGpuExecutable":
    try:
        from ai_edge_litert.compiled_model import CompiledModel
        from ai_edge_litert.gpu_options import GpuOptions
        from ai_edge_litert.hardware_accelerator import HardwareAccelerator
        from ai_edge_litert.options import Options
    except ImportError as exc:
        raise BackendUnavailableError(f"vulkan: .tflite needs ai-edge-litert with CompiledModel: {exc}") from exc
    fp16 = options.precision == "fp16"
    gpu = Options(hardware_accelerators=HardwareAccelerator.GPU, gpu_options=GpuOptions(enforce_f32=not fp16))
    def build() -> Any:
        try:
            return CompiledModel.from_file(str(path), environment=_shared_environment(), options=gpu)
        except Exception as exc:  # LiteRT raises RuntimeError/ValueError from its C++ status
            raise ModelLoadError(f"vulkan: LiteRT GPU accelerator cannot compile {path}: {exc}") from exc

    executable = LiteRtGpuExecutable(build, path, device, options.precision)
    if fp16:
        executable.drift = _tflite_drift(path, executable)
    return executable


class LiteRtGpuExecutable:
    """The primary signature of a ``CompiledModel`` on the GPU accelerator."""

    thread_safe = False

    def __init__(self, build: Callable[[], Any], path: Path, device: dict[str, Any], precision: str) -> None:
        self._build = build
        compiled = self._compiled = build()
        self._signature = next(iter(compiled.get_signature_list()))
        details_in = compiled.get_input_tensor_details(self._signature)
        details_out = compiled.get_output_tensor_details(self._signature)
        self.inputs = [TensorSpec(n, str(d["dtype"]), tuple(d["shape"])) for n, d in details_in.items()]
        self.outputs = [TensorSpec(n, str(d["dtype"]), tuple(d["shape"])) for n, d in details_out.items()]
        self._in_buffers = compiled.create_input_buffers(0)
        self._out_buffers = compiled.create_output_buffers(0)
        self.fully_accelerated = bool(compiled.is_fully_accelerated())
        self.backend_nodes = {"vulkan": _node_count(path)}
        self.device = "gpu"
        self.drift: dict[str, Any] | None = None
        self._device = device
        self._precision = precision
        self._has_run = False
        self.rebuilds = 0

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._compiled is None:
            raise BackendError("vulkan: executable is closed")
        for attempt in range(FIRST_RUN_REBUILDS + 1):
            try:
                outputs = self._run_once(feeds)
                self._has_run = True
                return outputs
            except BackendError as exc:
                # NOTE: LiteRT waits at most 120 s for the first run's buffers; a cold shader compile on
                # a loaded software device takes longer and leaves the model unusable. The compile goes
                # on into Mesa's cache, so a rebuilt model's first run is then fast.
                if self._has_run or "lock" not in str(exc) or attempt == FIRST_RUN_REBUILDS:
                    raise
                self._compiled = self._build()
                self._in_buffers = self._compiled.create_input_buffers(0)
                self._out_buffers = self._compiled.create_output_buffers(0)
                self.rebuilds += 1
        raise AssertionError("unreachable: the last attempt raises or returns")

    def _run_once(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            for spec, buffer in zip(self.inputs, self._in_buffers):
                buffer.write(np.ascontiguousarray(feeds[spec.name], dtype=spec.dtype))
            self._compiled.run_by_index(0, self._in_buffers, self._out_buffers)
            return {spec.name: buffer.read(int(np.prod(spec.shape)), np.dtype(spec.dtype)).reshape(spec.shape)
                    for spec, buffer in zip(self.outputs, self._out_buffers)}
        except (RuntimeError, ValueError) as exc:
            raise BackendError(f"vulkan: LiteRT GPU accelerator run failed: {exc}") from exc

    def describe(self) -> dict[str, Any]:
        return {"backend": "vulkan", "engine": "LiteRT CompiledModel, GPU accelerator (WebGPU/Dawn, Vulkan)",
                **self._device, "fully_accelerated": self.fully_accelerated, "first_run_rebuilds": self.rebuilds,
                "precision": {"mode": self._precision, **({"drift": self.drift} if self.drift else {})}}

    def close(self) -> None:
        self._compiled = None
        self._in_buffers = self._out_buffers = []


def _node_count(path: Path) -> int:
    from ai_edge_litert.interpreter import Interpreter

    return len(Interpreter(model_path=str(path))._get_ops_details())


def _tflite_drift(path: Path, executable: LiteRtGpuExecutable) -> dict[str, Any]:
    """fp16 on the accelerator against LiteRT's fp32 CPU interpreter, on one seeded feed."""
    from ai_edge_litert.interpreter import Interpreter

    rng = np.random.default_rng(DRIFT_SEED)
    feeds = {s.name: rng.uniform(-1, 1, s.shape).astype(s.dtype) for s in executable.inputs}
    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        interpreter.set_tensor(detail["index"], feeds[detail["name"]])
    interpreter.invoke()
    want = {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}
    return {"measured": True, **drift_between(executable.run(feeds), want)}
