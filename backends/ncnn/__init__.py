"""The ``ncnn`` backends: ncnn on the CPU and on Vulkan, models converted by pnnx.

Modules: ``ops`` (which nodes), ``convert`` (pnnx and the conversion cache),
``gate`` (seeded check against ONNX Runtime), ``net`` (ncnn options, one
sample), ``executable`` (shape buckets, batch loop), ``backend``.
Importing this package imports ncnn only when a backend is used.
"""

from backends.ncnn.backend import NcnnBackend, NcnnVulkanBackend

__all__ = ["NcnnBackend", "NcnnVulkanBackend"]
