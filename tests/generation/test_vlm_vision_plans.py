"""A VLM's vision encoder on the ``gpu`` plan equals the ``cpu`` plan (issue 22): OpenCL and Vulkan.

On a phone the vision encoder is the part that should run on the GPU while the CPU decodes
the running streams, so it must actually land there: each case also checks where the
graph's nodes ran (``backend_nodes``, no run-time fallback), not only the numbers.

* ``opencl`` (PoCL here): the whole tower. ``grid_thw`` is bound by value, so the rotary
  tables and the per-frame attention mask it derives fold once per grid at compile time.
* ``vulkan`` (ONNX Runtime's WebGPU EP on lavapipe): the EP takes every float node of the
  tower; ORT keeps the integer position arithmetic on the host, a small ``cpu`` stage.

Inputs are real preprocessed images (the folder's own image processor) at two sizes, so the
patch count, a dynamic dim, differs between runs, then both images in one call (two rows of
``grid_thw``: the attention mask is block-diagonal). The oracle is the ``cpu`` plan (ONNX Runtime).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from edge_runtime.config import runtime_config
from edge_runtime.runtime import Runtime

# A cold build of the tower's kernels takes ~20 s per patch count on PoCL and ~15 s on lavapipe
# on an idle 2-core box, several times that on a loaded one.
pytestmark = pytest.mark.timeout(900)

IMAGE_SIZES = ((200, 120), (1080, 2400))  # (width, height): a small crop and a phone screenshot
SEED = 3


@pytest.fixture(scope="module")
def vlm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edge_runtime.vlm_zoo import write_vlm_folder

    return write_vlm_folder(tmp_path_factory.mktemp("vlm") / "qwen2_vl", "qwen2_vl", seed=SEED)


@pytest.fixture(scope="module")
def image_feeds(vlm_folder: Path) -> list[dict[str, np.ndarray]]:
    from PIL import Image

    from edge_runtime.generation.vision.preprocess import VisionBudget, image_processor

    config = json.loads((vlm_folder / "config.json").read_text())
    processor = image_processor(vlm_folder, config, VisionBudget())
    rng = np.random.default_rng(SEED)
    feeds = []
    for width, height in IMAGE_SIZES:
        # blocky noise: colour regions with edges, closer to a screenshot than per-pixel noise
        blocks = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
        pixels = np.repeat(np.repeat(blocks, 8, axis=0), 8, axis=1)[:height, :width]
        feeds.append(dict(processor.process(Image.fromarray(pixels)).feeds))
    counts = [f["pixel_values"].shape[0] for f in feeds]
    assert len(set(counts)) == len(counts), f"the image sizes must give different patch counts: {counts}"
    assert all(f["pixel_values"].shape[1] == 1176 and f["grid_thw"].dtype == np.int64 for f in feeds)
    # both images in one call: attention is then confined to each image by the mask grid_thw derives
    feeds.append({name: np.concatenate([f[name] for f in feeds]) for name in feeds[0]})
    return feeds


def _runtime(tmp_path: Path, request: pytest.FixtureRequest, accelerator: str) -> Runtime:
    """A runtime whose only accelerator is ``accelerator`` (asked for by name: a software device counts)."""
    runtime = Runtime(runtime_config(env={"EDGE_RUNTIME_CACHE": str(tmp_path / "cache")}))
    if accelerator == "opencl":
        from backends.opencl import OpenCLBackend

        backend = OpenCLBackend(cache_dir=tmp_path / "cache", tune=False)  # tuning: minutes on PoCL
    else:
        from backends.vulkan import VulkanBackend

        backend = VulkanBackend(cache_dir=tmp_path / "cache")
    availability = backend.availability()
    assert availability.ok, availability.reason
    for other in ("opencl", "vulkan", "tflite", "ncnn"):
        runtime._backends.pop(other, None)
    runtime._backends[accelerator] = (backend, availability)
    runtime.match = type(runtime.match)(runtime.match.name, runtime.match.reasons, (accelerator, "cpu"),
                                        runtime.match.hints)
    request.addfinalizer(runtime.close)
    return runtime


def _float_tower(proto: onnx.ModelProto) -> frozenset[int]:
    """Indices of the nodes computing on ``pixel_values``' data (not its shape): the tower's float work."""
    reached, tower = {"pixel_values"}, set()
    for index, node in enumerate(proto.graph.node):
        if node.op_type != "Shape" and any(name in reached for name in node.input):
            reached.update(node.output)
            tower.add(index)
    return frozenset(tower)


def _assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    scale = max(float(np.max(np.abs(want))), 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale, err_msg=what)


@pytest.mark.parametrize("accelerator", [pytest.param("opencl", marks=pytest.mark.requires_opencl),
                                         pytest.param("vulkan", marks=pytest.mark.requires_vulkan)])
def test_vision_encoder_on_the_gpu_plan_equals_the_cpu_plan(accelerator, vlm_folder, image_feeds, tmp_path,
                                                            request) -> None:
    path = vlm_folder / "onnx" / "vision_encoder.onnx"
    total = len(onnx.load(path).graph.node)
    runtime = _runtime(tmp_path, request, accelerator)
    # cost estimates at the screenshot's size: the partition is then the one that image gets
    shapes = {name: value.shape for name, value in image_feeds[1].items()}
    planner = runtime.planner(path, shapes)
    tower, claimed = _float_tower(planner.prepared.model), planner.claims[accelerator]
    assert not tower - claimed, f"{accelerator} refuses tower nodes {sorted(tower - claimed)}"
    if accelerator == "opencl":  # positions fold from the value-bound grid_thw: nothing left to the host
        assert claimed == frozenset(range(total)) and planner.unclaimed_ops() == {}
    cpu = runtime.load(path, name="vision_cpu", plan="cpu")
    gpu = runtime.load(path, name="vision_gpu", plan="gpu", input_shapes=shapes)
    assert cpu.backend_nodes == {"cpu": total}
    counts = gpu.backend_nodes
    assert sum(counts.values()) == total, counts
    if accelerator == "opencl":
        assert counts == {"opencl": total}
    else:  # the planner may keep a copy-bound island on the host, never the transformer blocks
        assert counts.get("vulkan", 0) >= len(tower) // 2, counts
    for feeds in image_feeds:
        want = cpu.run(feeds)["image_features"]
        got = gpu.run(feeds)["image_features"]
        assert want.shape[0] * 4 == feeds["pixel_values"].shape[0]  # one row per 2x2 merge block
        _assert_close(got, want, f"{accelerator}: image_features of {feeds['pixel_values'].shape[0]} patches")
    described = gpu.describe()["executable"]
    assert described["plan"] == "gpu" and described["fallbacks"] == []  # nothing fell back to the host at run time
    assert any(stage["backend"] == accelerator and "image_features" in stage["outputs"]
               for stage in described["stages"])


FAMILY_IMAGES = ((140, 300), (300, 180))  # (width, height): two patch (or tile) counts, small for PoCL's builds
HEAVY_OPS = ("MatMul", "Conv", "Softmax", "LayerNormalization", "Erf", "Sigmoid")


@pytest.mark.parametrize("family", ["qwen2_5_vl", "smolvlm", "glm4v", "qwen3_vl"])
@pytest.mark.parametrize("accelerator", [pytest.param("opencl", marks=pytest.mark.requires_opencl),
                                         pytest.param("vulkan", marks=pytest.mark.requires_vulkan)])
def test_other_families_encoders_on_the_gpu_plan_equal_the_cpu_plan(accelerator, family, tmp_path, request) -> None:
    """Qwen2.5-VL (windowed attention, window index from ``image_grid_thw``) and SmolVLM (tiles, a patch
    mask): the accelerator takes every matrix product, norm and softmax of the tower; only integer and
    mask bookkeeping may stay on the host (SmolVLM's patch selection: Compress, Where, ReduceSum...)."""
    from PIL import Image

    from edge_runtime.generation.vision.preprocess import VisionBudget, image_processor
    from edge_runtime.vlm_zoo import write_vlm_folder

    folder = write_vlm_folder(tmp_path / family, family, seed=SEED)  # portable attention: the gpu plan's form
    processor = image_processor(folder, json.loads((folder / "config.json").read_text()), VisionBudget())
    rng = np.random.default_rng(SEED)
    feeds = [dict(processor.process(Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))).feeds)
             for w, h in FAMILY_IMAGES]
    path = folder / "onnx" / "vision_encoder.onnx"
    total = len(onnx.load(path).graph.node)
    runtime = _runtime(tmp_path, request, accelerator)
    shapes = {name: value.shape for name, value in feeds[0].items()}
    planner = runtime.planner(path, shapes)
    heavy = {i for i, node in enumerate(planner.prepared.model.graph.node) if node.op_type in HEAVY_OPS}
    assert heavy and not heavy - planner.claims[accelerator], \
        f"{accelerator} refuses {sorted(planner.prepared.model.graph.node[i].op_type for i in heavy - planner.claims[accelerator])}"
    cpu = runtime.load(path, name="vision_cpu", plan="cpu")
    gpu = runtime.load(path, name="vision_gpu", plan="gpu", input_shapes=shapes)
    counts = gpu.backend_nodes
    assert sum(counts.values()) == total and counts.get(accelerator, 0) >= len(heavy), counts
    for each in feeds:
        want = cpu.run(each)["image_features"]
        _assert_close(gpu.run(each)["image_features"], want, f"{family} on {accelerator}: {list(want.shape)}")
    described = gpu.describe()["executable"]
    assert described["plan"] == "gpu" and described["fallbacks"] == []


@pytest.mark.requires_opencl
def test_auto_races_the_encoder_on_a_typical_screenshot(vlm_folder, tmp_path, request, monkeypatch) -> None:
    """``auto``'s race times the encoder on a typical screenshot's feeds, patch grid included: seeded
    feeds would give ``grid_thw`` all zeros (no image), so the race would time something else."""
    import edge_runtime.engine_choice as engine_choice
    from edge_runtime.generation.vision.loading import typical_screenshot
    from edge_runtime.generation.vision.preprocess import VisionBudget, image_processor
    from edge_runtime.generation.vision.settings import VisionSettings

    runtime = _runtime(tmp_path, request, "opencl")
    seen: list[dict[str, np.ndarray]] = []
    seeded = engine_choice.seeded_feeds

    def spy(model, shapes, sample=None):
        feeds = seeded(model, shapes, sample)
        seen.append(feeds)
        return feeds

    monkeypatch.setattr(engine_choice, "seeded_feeds", spy)
    model = runtime.load_generative(vlm_folder, name="agent", vision=VisionSettings(plan="auto"))
    request.addfinalizer(model.close)
    processor = image_processor(vlm_folder, json.loads((vlm_folder / "config.json").read_text()), VisionBudget())
    typical = processor.process(typical_screenshot()).feeds
    decision = model.prompter.encoder.model.report.decision
    assert decision is not None and decision.where == "in-process" and seen  # measured now, not from a cache
    assert all(np.array_equal(feeds["grid_thw"], typical["grid_thw"]) for feeds in seen)
    assert all(feeds["pixel_values"].shape == typical["pixel_values"].shape for feeds in seen)
    assert typical["grid_thw"].min() > 0  # what seeded feeds lack: they would be zeros


def test_seeded_feeds_take_the_sample_where_its_shape_matches() -> None:
    from onnx import TensorProto, helper

    from edge_runtime.engine_choice import seeded_feeds

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
                               helper.make_tensor_value_info("grid", TensorProto.INT64, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    model = helper.make_model(graph)
    grid = np.array([[1, 4, 6]], np.int64)
    feeds = seeded_feeds(model, {"x": (3, 4), "grid": (1, 3)}, {"grid": grid, "x": np.ones((2, 4), np.float32)})
    np.testing.assert_array_equal(feeds["grid"], grid)  # the sample's values
    assert feeds["x"].shape == (3, 4) and not np.all(feeds["x"] == 1)  # another shape: seeded, not the sample
    assert np.array_equal(seeded_feeds(model, {"x": (3, 4), "grid": (1, 3)})["grid"], np.zeros((1, 3)))
