"""The ONNX backend API (``onnx.backend.base.Backend``) over the OpenCL executor.

Lets the official ONNX node test cases (``onnx.backend.test.BackendTest``)
run on our kernels. All preparations share one :class:`OpenCLBackend` (one
OpenCL context, one in-memory tuning and canary state) unless a backend is
passed as ``opencl_backend=``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from onnx.backend.base import Backend, BackendRep, namedtupledict

from backends.base import CompileOptions
from backends.opencl.backend import OpenCLBackend

if TYPE_CHECKING:
    import onnx

    from backends.opencl.executable import OpenCLExecutable


@functools.lru_cache(maxsize=1)
def shared_backend() -> OpenCLBackend:
    """The process-wide backend the ONNX API uses by default (no disk caches)."""
    return OpenCLBackend(cache_dir=None)


class OpenCLBackendRep(BackendRep):
    """A prepared model: ``run`` takes inputs in graph order (or a name -> array dict)."""

    def __init__(self, executable: "OpenCLExecutable") -> None:
        self.executable = executable
        self.input_names = [spec.name for spec in executable.inputs]
        self.output_names = [spec.name for spec in executable.outputs]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            values = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            feeds = dict(zip(self.input_names, values))
        outputs = self.executable.run(feeds)
        return namedtupledict("Outputs", self.output_names)(*[outputs[n] for n in self.output_names])


class OpenCLOnnxBackend(Backend):
    """``prepare``/``run_model``/``supports_device`` for the ONNX backend test suite."""

    @classmethod
    def _backend(cls, kwargs: dict[str, Any]) -> OpenCLBackend:
        return kwargs.get("opencl_backend") or shared_backend()

    @classmethod
    def is_compatible(cls, model: "onnx.ModelProto", device: str = "CPU", **kwargs: Any) -> bool:
        """Whether the backend claims the whole model (see OpenCLBackend.unclaimed_nodes)."""
        return not cls._backend(kwargs).unclaimed_nodes(model)

    @classmethod
    def prepare(cls, model: "onnx.ModelProto", device: str = "CPU", **kwargs: Any) -> OpenCLBackendRep:
        super().prepare(model, device, **kwargs)
        options = CompileOptions(precision=kwargs.get("precision", "fp32"))
        return OpenCLBackendRep(cls._backend(kwargs).compile(model, options))

    @classmethod
    def run_model(cls, model: "onnx.ModelProto", inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: "onnx.NodeProto", inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, Any]] | None = None, **kwargs: Any) -> tuple[np.ndarray, ...]:
        raise NotImplementedError("opencl: run single nodes through run_model (they need shapes)")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """"CPU" (the host's default device, which is where our OpenCL device is chosen)."""
        return device == "CPU"
