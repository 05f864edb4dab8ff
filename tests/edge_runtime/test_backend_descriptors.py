"""The backend descriptors are the one source the scheduler, planner, catalogue check and CLI read."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from backends.base import BackendDescriptor
from backends.descriptors import DESCRIPTORS, backends_on, descriptor
from device_profiles import load_catalog
from edge_runtime.backend_table import BACKENDS, USER_BACKENDS
from edge_runtime.cli import build_parser
from edge_runtime.scheduler.plans import CallablePlan, plan_device, plan_kind


def test_every_importable_backend_is_described_and_users_see_only_selectable_ones() -> None:
    assert set(BACKENDS) <= set(DESCRIPTORS)
    assert "null" in BACKENDS and "null" not in USER_BACKENDS
    assert {"cpu", "opencl", "tflite"} <= set(USER_BACKENDS)
    assert all(DESCRIPTORS[n].selectable for n in USER_BACKENDS)


def test_descriptors_say_device_api_and_formats() -> None:
    assert descriptor("vulkan") == BackendDescriptor("vulkan", "gpu", "vulkan", ("onnx", "tflite"))
    assert descriptor("ncnn").device == "cpu" and descriptor("ncnn").api == "ncnn"
    assert descriptor("tflite").takes("tflite") and not descriptor("tflite").takes("onnx")
    assert descriptor("cpu").thread_safe
    assert descriptor("npu") is None
    assert backends_on("gpu") >= {"opencl", "vulkan"} and "cpu" not in backends_on("gpu")


@pytest.mark.parametrize(("fields", "message"), [
    ({"device": "npu", "formats": ("onnx",)}, "device must be one of"),
    ({"device": "gpu", "formats": ("pt",)}, "formats must be from"),
    ({"device": "gpu", "formats": ()}, "formats must be from"),
])
def test_a_malformed_descriptor_is_refused(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        BackendDescriptor("x", api="x", **fields)


def test_the_packaged_catalogue_names_only_described_backends() -> None:
    entries = load_catalog(known_backends=DESCRIPTORS)
    assert all(set(e.backend_order) <= set(DESCRIPTORS) for e in entries.values())


def test_plans_are_classified_by_the_descriptors() -> None:
    def plan(*backends: str, device: str = "") -> CallablePlan:
        return CallablePlan("p", backends, lambda feeds: {}, device=device)

    assert plan_device(plan("vulkan")) == "gpu" and plan_kind("vulkan", plan("vulkan")) == "gpu"
    assert plan_kind("p", plan("cpu", "vulkan")) == "hybrid"
    assert plan_device(plan("ncnn")) == "cpu" and plan_device(plan("cloud")) == "cloud"
    # tflite alone is a CPU plan; the same backend on a GPU delegate says so through its device.
    assert plan_kind("tflite", plan("tflite")) == "cpu"
    assert plan_kind("tflite", plan("tflite", device="gpu")) == "gpu"


def test_a_tflite_model_on_a_delegate_becomes_a_gpu_plan_in_the_scheduler() -> None:
    from edge_runtime.scheduler.plans import model_plan

    for device in ("gpu", "cpu"):
        model = SimpleNamespace(backend_nodes={"tflite": 3}, _run_validated=lambda f: {},
                                executable=SimpleNamespace(device=device))
        assert plan_device(model_plan("tflite", model)) == device


def test_the_cli_offers_the_selectable_backends() -> None:
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    backend = next(a for a in run._actions if a.dest == "backend")
    assert all(name in backend.help for name in USER_BACKENDS)
