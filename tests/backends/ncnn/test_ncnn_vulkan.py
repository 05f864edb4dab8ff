"""ncnn's Vulkan path (lavapipe in tests and CI) equals ONNX Runtime in fp32."""

from __future__ import annotations

import numpy as np
import pytest

from backends.ncnn import NcnnVulkanBackend
from ncnn_helpers import assert_close, conv_model, ort_outputs

pytestmark = pytest.mark.requires_ncnn_vulkan


def test_ncnn_vulkan_runs_a_cnn_like_onnxruntime(options) -> None:
    backend = NcnnVulkanBackend()
    availability = backend.availability()
    assert availability.ok and "Vulkan" in availability.device
    proto = conv_model(seed=11, dynamic=True)
    executable = backend.compile(proto, options)
    try:
        assert executable.describe()["vulkan_device"] is not None and executable.thread_safe is False
        for shape in ((2, 4, 16, 16), (1, 4, 24, 8)):
            x = np.random.default_rng(12).standard_normal(shape).astype(np.float32)
            assert_close(executable.run({"x": x})["y"], ort_outputs(proto, {"x": x})[0])
        assert len(executable.describe()["buckets"]) == 2
    finally:
        executable.close()
