"""A crashing, hanging or wrong Vulkan driver makes ``vulkan`` unavailable; the CPU keeps serving."""

from __future__ import annotations

import numpy as np
import pytest

from backends.vulkan import VulkanBackend, canary
from edge_runtime.config import runtime_config
from edge_runtime.errors import BackendUnavailableError
from edge_runtime.runtime import Runtime

pytestmark = pytest.mark.requires_vulkan


@pytest.mark.parametrize(("fault", "words"), [("crash", "crashed the canary (SIGSEGV)"),
                                              ("hang", "hung"), ("wrong", "wrong results")])
def test_a_broken_driver_leaves_the_cpu_serving(fault, words, monkeypatch, tmp_path) -> None:
    import onnx

    from edge_runtime.model_zoo import BUILDERS

    mlp_model_path = tmp_path / "mlp.onnx"
    onnx.save(BUILDERS["mlp"](), mlp_model_path)
    monkeypatch.setattr(canary, "_memo", {})
    monkeypatch.setenv(canary.FAULT_ENV, fault)
    backend = VulkanBackend(cache_dir=tmp_path)
    if fault == "hang":
        monkeypatch.setattr(canary, "_run_child", _short_timeout(canary._run_child))
    availability = backend.availability()
    assert not availability.ok and words in availability.reason
    rt = Runtime(runtime_config(env={"EDGE_RUNTIME_CACHE": str(tmp_path / "cache")}))
    rt._backends["vulkan"] = (backend, availability)
    with pytest.raises(BackendUnavailableError, match=words.split(" (")[0]):
        rt.load(mlp_model_path, backend="vulkan")
    model = rt.load(mlp_model_path, backend="cpu")
    x = np.ones([d if isinstance(d, int) else 1 for d in model.inputs[0].shape], np.float32)
    assert np.all(np.isfinite(next(iter(model.run({model.inputs[0].name: x}).values()))))
    rt.close()


def _short_timeout(run_child):
    def run(env, timeout_s):
        return run_child(env, 3.0)  # a hang is a hang: no need to wait the real budget
    return run
