"""Compile-time behaviour: claims, unsupported-node errors, errors with names, fp16, specialisation."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from backends.base import CompileOptions
from backends.errors import BackendError, BackendUnavailableError, InvalidInputError, UnsupportedNodesError
from backends.onnx_graph import op_names, tensor_specs
from bench_opencl import half_storage_outputs
from make_models import build_mobilenet
from tests.backends.model_helpers import assert_close, make_model, ort_outputs, rand, tensor

pytestmark = pytest.mark.requires_opencl


def test_unclaimed_nodes_are_all_listed(ocl_backend) -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok_relu"),
        helper.make_node("TopK", ["a", "k"], ["v", "i"], name="topk"),
        helper.make_node("Conv", ["x5", "w5"], ["c"], name="conv3d"),
        helper.make_node("Resize", ["a", "", "s"], ["r"], name="cubic", mode="cubic"),
        helper.make_node("Cast", ["x"], ["y"], name="to_int", to=TensorProto.INT32),
    ]
    model = make_model(
        nodes, [tensor("x", [1, 2, 4, 4]), tensor("x5", [1, 2, 3, 4, 4])],
        [tensor("v", None), tensor("i", None, TensorProto.INT64), tensor("c", None), tensor("r", None),
         tensor("y", None, TensorProto.INT32)],
        {"k": np.array([2], np.int64), "w5": np.zeros((3, 2, 1, 1, 1), np.float32),
         "s": np.array([1, 1, 2, 2], np.float32)})
    with pytest.raises(UnsupportedNodesError) as info:
        ocl_backend.compile(model, CompileOptions())
    labels = op_names(model.graph.node)
    assert info.value.backend == "opencl"
    assert info.value.nodes == labels[1:]  # every refused node, in the partitioner's label format
    specs = tensor_specs(model)
    assert [ocl_backend.supports(n, specs) for n in model.graph.node] == [True, False, False, False, False]


def test_supports_checks_attributes_and_dtypes(ocl_backend) -> None:
    specs = tensor_specs(make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [1, 3, 8, 8])],
                                    [tensor("y", None)]))
    int_specs = tensor_specs(make_model([helper.make_node("Add", ["p", "q"], ["s"])],
                                        [tensor("p", [3], TensorProto.INT64), tensor("q", [3], TensorProto.INT64)],
                                        [tensor("s", None, TensorProto.INT64)]))
    yes = [helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear", coordinate_transformation_mode="align_corners"),
           helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect"),
           helper.make_node("Add", ["p", "q"], ["s"]),  # integer shape arithmetic: folded at compile time
           helper.make_node("Shape", ["x"], ["s"])]
    no = [helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear", antialias=1),
          helper.make_node("Resize", ["x", "", "s"], ["y"], coordinate_transformation_mode="tf_crop_and_resize"),
          helper.make_node("MaxPool", ["x"], ["y", "idx"], kernel_shape=[2, 2]),
          helper.make_node("BatchNormalization", ["x", "a", "b", "c", "d"], ["y"], training_mode=1),
          helper.make_node("Gelu", ["x"], ["y"], approximate="fast"),
          helper.make_node("Relu", ["x"], ["y"], domain="com.microsoft"),
          helper.make_node("RandomNormalLike", ["x"], ["y"])]
    all_specs = {**specs, **int_specs}
    assert all(ocl_backend.supports(n, all_specs) for n in yes)
    assert not any(ocl_backend.supports(n, all_specs) for n in no)


def test_integer_ops_on_runtime_data_are_refused_at_compile(ocl_backend) -> None:
    model = make_model([helper.make_node("Add", ["p", "q"], ["s"], name="int_add")],
                       [tensor("p", [3], TensorProto.INT64), tensor("q", [3], TensorProto.INT64)],
                       [tensor("s", None, TensorProto.INT64)])
    with pytest.raises(UnsupportedNodesError) as info:
        ocl_backend.compile(model, CompileOptions())
    assert info.value.nodes == ["int_add (Add)"]


def test_runtime_parameters_are_bound_by_value(ocl_backend) -> None:
    """A Resize whose scales arrive as a graph input specialises per scales value."""
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    model = make_model([node], [tensor("x", [1, 2, 3, 4]), tensor("scales", [4])], [tensor("y", None)], opset=13)
    executable = ocl_backend.compile(model, CompileOptions())
    rng = np.random.default_rng(3)
    x = rand(rng, 1, 2, 3, 4)
    for scales in ([1, 1, 2, 2], [1, 1, 3, 1.5], [1, 1, 2, 2]):
        feeds = {"x": x, "scales": np.array(scales, np.float32)}
        got = executable.run(feeds)["y"]
        assert_close(got, ort_outputs(model, feeds)[0])
    assert executable.specialisations_built == 2


def _metadata_model() -> onnx.ModelProto:
    """Qwen2-VL's pattern in small: ``grid`` [images, 3] int64 drives rotary-like tables and a mask."""
    nodes = [helper.make_node("Gather", ["grid", "one"], ["h"], axis=1, name="h"),
             helper.make_node("CumSum", ["h", "zero"], ["ends"], name="ends"),
             helper.make_node("Cast", ["ends"], ["angle"], to=TensorProto.FLOAT, name="angle"),
             helper.make_node("Cos", ["angle"], ["cos"], name="cos"),
             helper.make_node("Sin", ["angle"], ["sin"], name="sin"),
             helper.make_node("Unsqueeze", ["h", "ax1"], ["rows"], name="rows"),
             helper.make_node("Unsqueeze", ["h", "zero1"], ["cols"], name="cols"),
             helper.make_node("Equal", ["rows", "cols"], ["same"], name="same"),
             helper.make_node("Where", ["same", "sin", "minus"], ["bias"], name="bias"),
             helper.make_node("Mul", ["x", "cos"], ["scaled"], name="scaled"),
             helper.make_node("Add", ["scaled", "bias"], ["y"], name="y")]
    inits = {"one": np.array(1, np.int64), "zero": np.array(0, np.int64), "ax1": np.array([1], np.int64),
             "zero1": np.array([0], np.int64), "minus": np.float32(-1.0)}
    return make_model(nodes, [tensor("x", ["n", "n"]), tensor("grid", ["n", 3], TensorProto.INT64)],
                      [tensor("y", None)], inits)


def test_metadata_tables_are_bound_by_value_and_what_they_derive_folds(ocl_backend) -> None:
    """An integer [rows, 3] input read only by shape arithmetic specialises per value: the CumSum,
    Cos/Sin and Where it feeds fold, so the whole graph runs here (claims), though the Where
    alone is not claimed (supports)."""
    model = _metadata_model()
    specs = tensor_specs(model)
    # alone, a Where of float data on a bool mask has no kernel (integer CumSum/Equal fold anyway)
    assert {n.name for n in model.graph.node if not ocl_backend.supports(n, specs)} == {"bias"}
    assert ocl_backend.claims(model, specs) == frozenset(range(len(model.graph.node)))
    executable = ocl_backend.compile(model, CompileOptions())
    assert executable.describe()["value_bound_inputs"] == ["grid"]
    rng = np.random.default_rng(5)
    for grid in ([[1, 4, 6], [1, 2, 8], [1, 4, 4]], [[1, 6, 2], [1, 6, 6], [1, 2, 2]], [[1, 2, 2], [1, 8, 4]]):
        grid = np.array(grid, np.int64)
        feeds = {"x": rand(rng, len(grid), len(grid)), "grid": grid}
        assert_close(executable.run(feeds)["y"], ort_outputs(model, feeds)[0])
    assert executable.specialisations_built == 3  # one per distinct grid, though two share a shape


def test_per_token_integer_inputs_are_not_bound_by_value(ocl_backend) -> None:
    """ids [batch, seq] or a long fixed row are data, not metadata: binding them would build per request."""
    for shape in (["batch", "seq"], [1, 128]):
        nodes = [helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT, name="cast"),
                 helper.make_node("Mul", ["x", "f"], ["y"], name="mul")]
        model = make_model(nodes, [tensor("x", shape), tensor("ids", shape, TensorProto.INT64)], [tensor("y", None)])
        assert ocl_backend.unclaimed_nodes(model) == {"cast (Cast)": "Cast on non-float32 runtime data"}


def test_specialisations_are_kept_in_a_bounded_lru() -> None:
    from backends.opencl import OpenCLBackend

    backend = OpenCLBackend(tune=False, max_specialisations=2)
    model = make_model([helper.make_node("Softmax", ["x"], ["y"])], [tensor("x", ["batch", 5])], [tensor("y", None)])
    executable = backend.compile(model, CompileOptions())
    rng = np.random.default_rng(4)
    for batch in (1, 2, 3, 1, 3):
        executable.run({"x": rand(rng, batch, 5)})
    # 1, 2, 3 build; 1 was evicted by 3 and builds again; 3 is still cached.
    assert executable.specialisations_built == 4
    assert len(executable.describe()["specialisations"]) == 2


def test_feed_with_wrong_static_dim_names_the_tensor(ocl_backend) -> None:
    executable = ocl_backend.compile(build_mobilenet(image_size=32), CompileOptions())
    with pytest.raises(InvalidInputError, match=r"'input' expects shape \['batch', 3, 32, 32\], got \[1, 3, 31, 32\]"):
        executable.run({"input": np.zeros((1, 3, 31, 32), np.float32)})


def test_cl_status_codes_have_names() -> None:
    from backends.opencl.cl_errors import status_name

    assert status_name(-5) == "CL_OUT_OF_RESOURCES (-5)"
    assert status_name(-11) == "CL_BUILD_PROGRAM_FAILURE (-11)"
    assert status_name(-9999) == "CL_UNKNOWN_ERROR (-9999)"


def test_build_failure_is_a_backend_error_naming_device_and_kernel() -> None:
    from backends.opencl.builder import ProgramBuilder
    from backends.opencl.device import shared_device
    from backends.opencl.stats import CompileStats

    handle = shared_device()
    builder = ProgramBuilder(handle, None, "", CompileStats())
    with pytest.raises(BackendError) as info:
        builder.build("__kernel void broken(__global float* x) { x[0] = undefined_name; }", "", "test kernel")
    message = str(info.value)
    assert handle.info.name in message and "test kernel" in message
    assert "CL_BUILD_PROGRAM_FAILURE (-11)" in message and "undefined_name" in message


def test_launch_failure_is_a_backend_error_naming_kernel_and_shape(ocl_backend) -> None:
    """A work-group size the device refuses surfaces as BackendError, not a crash."""
    from dataclasses import replace

    from backends.opencl.plan import Variant

    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [tensor("x", [3, 5])],
                       [tensor("y", None)])
    executable = ocl_backend.compile(model, CompileOptions())
    runner = next(iter(executable._cache.values()))
    kernel, _, _, step = runner._launches[0]
    too_big = runner.handle.info.max_work_group_size * 2
    bad = replace(step, variants=(Variant(step.variants[0].defines, (too_big,), (too_big,)),))
    runner._launches[0] = (kernel, (too_big,), (too_big,), bad)
    with pytest.raises(BackendError, match=r"relu \(Relu\).*3x5.*CL_INVALID_WORK_GROUP_SIZE \(-54\)"):
        executable.run({"x": np.ones((3, 5), np.float32)})


def _small_cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(10)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c"], ["h"]),
             helper.make_node("GlobalAveragePool", ["h"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["y"])]
    return make_model(nodes, [tensor("x", ["batch", 3, 16, 16])], [tensor("y", None)],
                      {"w": rand(rng, 8, 3, 3, 3), "b": rand(rng, 8), "fc": rand(rng, 8, 5)})


def test_fp16(ocl_backend) -> None:
    """fp16 needs cl_khr_fp16; the half-storage kernels keep ~1e-3 relative accuracy.

    Measured on PoCL (storage in half, arithmetic in float), max error relative
    to the output range: this CNN ~1e-3, MobileNet-style 1.4e-3, transformer
    block 1.6e-3 (``tools/bench_opencl.py`` reports it as ``fp16_accuracy``).
    """
    from backends.opencl.device import shared_device

    model = _small_cnn()
    feeds = {"x": np.random.default_rng(9).standard_normal((2, 3, 16, 16)).astype(np.float32)}
    want = ort_outputs(model, feeds)[0]
    handle = shared_device()
    if handle.info.has_fp16:
        got = ocl_backend.compile(model, CompileOptions(precision="fp16")).run(feeds)["y"]
    else:
        with pytest.raises(BackendUnavailableError, match="cl_khr_fp16"):
            ocl_backend.compile(model, CompileOptions(precision="fp16"))
        got = half_storage_outputs(model, feeds)
    assert_close(got, want, rtol=5e-3)
    assert not np.allclose(got, want, rtol=1e-6, atol=0)  # it really ran in half precision
