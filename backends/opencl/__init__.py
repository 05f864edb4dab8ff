"""The ``opencl`` backend (our own kernels through pyopencl).

Importing this package imports no native library: pyopencl, onnx and the
kernel sources are loaded on first use.
"""

from backends.opencl.backend import OpenCLBackend

__all__ = ["OpenCLBackend"]
