"""The ``vulkan`` backend: maintained engines that reach Vulkan through Dawn (WebGPU).

ONNX models run on ONNX Runtime's WebGPU execution provider (the plugin package
``onnxruntime-ep-webgpu``), ``.tflite`` models on LiteRT's GPU accelerator
through ``CompiledModel``. Importing this package imports no native library.
"""

from backends.vulkan.backend import VulkanBackend

__all__ = ["VulkanBackend"]
