"""One descriptor per backend: the facts every layer above reads (see ``BackendDescriptor``).

Light on purpose: importing this module imports no backend and no native
library, so the scheduler and the CLI can classify backends by name. A new
backend adds its descriptor here and its import string to
``edge_runtime.backend_table.BACKENDS``.
"""

from __future__ import annotations

from backends.base import BackendDescriptor

CPU = BackendDescriptor("cpu", device="cpu", api="onnxruntime", formats=("onnx",), thread_safe=True)
OPENCL = BackendDescriptor("opencl", device="gpu", api="opencl", formats=("onnx",))
# ONNX through ONNX Runtime's WebGPU EP, .tflite through LiteRT's GPU accelerator; both reach Vulkan via Dawn.
VULKAN = BackendDescriptor("vulkan", device="gpu", api="vulkan", formats=("onnx", "tflite"))
# LiteRT's interpreter runs on the CPU (XNNPACK); an executable on a GPU delegate reports device "gpu".
TFLITE = BackendDescriptor("tflite", device="cpu", api="litert", formats=("tflite",))
# A second CPU engine for CNNs (models converted by pnnx); extractors of one net run concurrently.
NCNN = BackendDescriptor("ncnn", device="cpu", api="ncnn", formats=("onnx",), thread_safe=True)
# ncnn's Vulkan path (use_vulkan_compute): one call at a time per executable.
NCNN_VULKAN = BackendDescriptor("ncnn_vulkan", device="gpu", api="vulkan", formats=("onnx",))
NULL = BackendDescriptor("null", device="cpu", api="none", formats=("onnx", "tflite"), thread_safe=True,
                         selectable=False)
# Stage labels that are not local backends: a remote KServe v2 / OpenAI peer, and the name of
# a stand-in plan placed on the accelerator worker.
CLOUD = BackendDescriptor("cloud", device="cloud", api="kserve-v2", formats=("onnx",), thread_safe=True,
                          selectable=False)
GPU = BackendDescriptor("gpu", device="gpu", api="none", formats=("onnx",), selectable=False)

DESCRIPTORS: dict[str, BackendDescriptor] = {d.name: d for d in (CPU, OPENCL, VULKAN, TFLITE, NCNN, NCNN_VULKAN, NULL,
                                                                  CLOUD, GPU)}


def descriptor(name: str) -> BackendDescriptor | None:
    """The descriptor of backend ``name``, or None for a name no backend has."""
    return DESCRIPTORS.get(name)


def backends_on(device: str) -> frozenset[str]:
    """Names of the backends whose work lands on ``device`` ("cpu", "gpu", "cloud") by default."""
    return frozenset(n for n, d in DESCRIPTORS.items() if d.device == device)
