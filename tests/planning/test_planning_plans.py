"""Every plan gives the whole-model ONNX Runtime result, wherever the unclaimed islands are.

The accelerator is the cpu backend behind a wrapper that refuses chosen
nodes (runs anywhere) and, under ``requires_opencl``, the real OpenCL backend
behind the same wrapper. Oracle: a plain ONNX Runtime session on the model.
"""

from __future__ import annotations

from typing import Any

import pytest

from planning_fakes import assert_close_to, chain, feeds_for, ort_outputs, skip_dag

PLANS = ("cpu", "gpu", "hybrid", "auto")
# Island of refused nodes -> where it sits in skip_dag.
ISLANDS = {
    "none": (),
    "start": ("conv1",),
    "middle": ("sigmoid",),
    "end": ("fc",),
    "several": ("relu1", "gate_mul", "tanh_aux"),
    "side_branch": ("conv_aux",),
}


def check_every_plan(make_planner: Any, options: Any, model: Any, refuse: tuple[str, ...], inner: Any = None,
                     batches: tuple[int, ...] = (1, 3)) -> dict[str, Any]:
    # Costs at batch 32: big enough for the accelerator to pay for its copies.
    planner, accel, _ = make_planner(model, refuse_nodes=refuse, inner=inner, input_shapes={"x": (32, 4, 8, 8)})
    executors = {}
    for name in PLANS:
        executor = planner.compile(planner.layout(name), options)
        for batch in batches:
            feeds = feeds_for(model, batch, seed=batch)
            assert_close_to(executor.run(feeds), ort_outputs(model, feeds))
        # Refused nodes never run on the accelerator.
        for stage in executor.stages:
            names = {planner.prepared.model.graph.node[n].name for n in stage.spec.nodes}
            if stage.backend == accel.name:
                assert not names & set(refuse), (name, names)
        assert sum(executor.backend_nodes.values()) == len(model.graph.node), name
        executors[name] = executor
    return executors


@pytest.mark.aarch64
@pytest.mark.parametrize("island", sorted(ISLANDS))
def test_every_plan_equals_onnxruntime_with_islands_on_a_dag(make_planner, options, island: str) -> None:
    executors = check_every_plan(make_planner, options, skip_dag(), ISLANDS[island])
    assert executors["cpu"].backends == ("cpu",)
    # With a fast accelerator, the gpu plan uses it, and the cpu only where it must.
    assert "restricted" in executors["gpu"].backends
    if ISLANDS[island]:
        assert "cpu" in executors["gpu"].backends
    assert set(executors["hybrid"].backends) <= {"cpu", "restricted"}


def test_chain_with_a_refused_op_type_in_the_middle(make_planner, options) -> None:
    model = chain()
    planner, _, _ = make_planner(model, refuse_ops=("Relu",), input_shapes={"x": (64, 256)})
    executor = planner.compile(planner.layout("gpu"), options)
    feeds = feeds_for(model, 4)
    assert_close_to(executor.run(feeds), ort_outputs(model, feeds))
    # MatMuls are worth their copies, the Relus sit between them on the cpu: 5 alternating stages.
    assert [s.backend for s in executor.stages] == ["restricted", "cpu", "restricted", "cpu", "restricted"]


def test_dynamic_batch_plans_take_any_batch_size(make_planner, options) -> None:
    model = skip_dag(seed=3)
    planner, _, _ = make_planner(model, refuse_nodes=("sigmoid",), input_shapes={"x": (8, 4, 8, 8)})
    executor = planner.compile(planner.layout("auto"), options)
    for batch in (1, 2, 7, 16):
        feeds = feeds_for(model, batch, seed=batch)
        assert_close_to(executor.run(feeds), ort_outputs(model, feeds))


def test_run_many_equals_run_one_by_one(make_planner, options) -> None:
    model = skip_dag(seed=5)
    planner, _, _ = make_planner(model, refuse_nodes=("skip_add", "flatten"))
    executor = planner.compile(planner.layout("hybrid"), options)
    requests = [feeds_for(model, batch, seed=i) for i, batch in enumerate((1, 3, 2, 1, 4, 2))]
    results = executor.run_many(requests)
    assert len(results) == len(requests)
    for feeds, got in zip(requests, results):
        assert_close_to(got, ort_outputs(model, feeds))


@pytest.mark.aarch64
def test_without_an_accelerator_only_cpu_and_auto_exist(options) -> None:
    from backends.cpu import CPUBackend
    from backends.errors import BackendUnavailableError
    from edge_runtime.planning.plans import Planner
    from planning_fakes import HOST_SPEED

    model = skip_dag()
    planner = Planner(model, {"cpu": CPUBackend()}, {"cpu": HOST_SPEED})
    assert planner.available() == ("cpu", "auto")
    for name in ("gpu", "hybrid"):
        with pytest.raises(BackendUnavailableError, match=f"plan '{name}' needs an accelerator"):
            planner.layout(name)
    executor = planner.compile(planner.layout("auto"), options)
    assert executor.backends == ("cpu",) and len(executor.stages) == 1
    feeds = feeds_for(model, 2)
    assert_close_to(executor.run(feeds), ort_outputs(model, feeds))


def test_a_stage_the_accelerator_cannot_compile_runs_on_the_host(make_planner, options, caplog) -> None:
    caplog.set_level("INFO", logger="edge_runtime.planning.plans")  # declined nodes: an INFO line
    model = chain()
    planner, accel, _ = make_planner(model, refuse_ops=("Relu",), input_shapes={"x": (64, 256)})
    layout = planner.layout("gpu")
    accel.refuse_nodes = {"mm1"}  # claims at planning time, refuses at compile time
    executor = planner.compile(layout, options)
    assert [s.backend for s in executor.stages] == ["restricted", "cpu", "cpu", "cpu", "restricted"]
    assert "mm1" in str(executor.describe()["stages"][2]["compile_fallback"])
    assert any("does not compile on restricted" in r.getMessage() for r in caplog.records)
    feeds = feeds_for(model, 2)
    assert_close_to(executor.run(feeds), ort_outputs(model, feeds))


# -- the same on the real OpenCL backend (PoCL in CI) -------------------------------------
@pytest.mark.requires_opencl
@pytest.mark.parametrize("island", ["start", "middle", "end", "several"])
def test_opencl_plans_equal_onnxruntime_with_islands(make_planner, options, opencl_backend, island: str) -> None:
    executors = check_every_plan(make_planner, options, skip_dag(), ISLANDS[island], inner=opencl_backend,
                                 batches=(1, 3))
    assert "restricted" in executors["gpu"].backends or not _claims_any(opencl_backend, skip_dag())


@pytest.mark.requires_opencl
def test_opencl_hybrid_run_many_equals_onnxruntime(make_planner, options, opencl_backend) -> None:
    model = chain(width=64)
    planner, _, _ = make_planner(model, refuse_nodes=("relu1",), inner=opencl_backend)
    executor = planner.compile(planner.layout("hybrid"), options)
    requests = [feeds_for(model, batch, seed=i) for i, batch in enumerate((1, 2, 3, 4))]
    for feeds, got in zip(requests, executor.run_many(requests)):
        assert_close_to(got, ort_outputs(model, feeds))


def _claims_any(backend: Any, model: Any) -> bool:
    from backends.onnx_graph import tensor_specs

    specs = tensor_specs(model)
    return any(backend.supports(node, specs) for node in model.graph.node)


@pytest.mark.aarch64
def test_auto_leaves_the_host_only_for_a_clear_gain(options) -> None:
    from backends.cpu import CPUBackend
    from edge_runtime.planning.cost import BackendSpeed
    from edge_runtime.planning.plans import AUTO_MIN_SPEEDUP, Planner
    from planning_fakes import RefusingBackend

    model = chain()
    host = BackendSpeed("cpu", gflops=10.0, mem_gbps=10.0, launch_us=1.0, stage_us=1.0)
    picked = {}
    for factor in (1.2, 10.0):  # how much faster the accelerator computes
        accel = BackendSpeed("restricted", gflops=10.0 * factor, mem_gbps=10.0 * factor, launch_us=1.0,
                             stage_us=1.0, copy_gbps=1e3, copy_latency_us=0.0)
        planner = Planner(model, {"cpu": CPUBackend(), "restricted": RefusingBackend(CPUBackend(), "restricted")},
                          {"cpu": host, "restricted": accel}, accelerator="restricted", input_shapes={"x": (64, 256)})
        auto, cpu = planner.layout("auto").partition, planner.layout("cpu").partition
        picked[factor] = auto.backends
        assert auto.latency_s <= cpu.latency_s
        if auto.backends != ("cpu",):
            assert auto.latency_s * AUTO_MIN_SPEEDUP <= cpu.latency_s
    assert picked == {1.2: ("cpu",), 10.0: ("restricted",)}
