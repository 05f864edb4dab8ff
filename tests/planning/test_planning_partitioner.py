"""Partitioner properties on random DAGs, checked against the ONNX graph itself.

Oracles: reachability computed here from the model's node inputs/outputs
(not from the planner's GraphView), the refusal lists, and ONNX Runtime.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest

from planning_fakes import assert_close_to, chain, feeds_for, ort_outputs, random_dag, skip_dag


def _reach(model: onnx.ModelProto) -> list[set[int]]:
    """``reach[i]``: indices of every node downstream of node i (transitively)."""
    nodes = list(model.graph.node)
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            consumers.setdefault(name, []).append(i)
    reach: list[set[int]] = []
    for i in range(len(nodes)):
        seen: set[int] = set()
        stack = [c for o in nodes[i].output for c in consumers.get(o, [])]
        while stack:
            j = stack.pop()
            if j not in seen:
                seen.add(j)
                stack.extend(c for o in nodes[j].output for c in consumers.get(o, []))
        reach.append(seen)
    return reach


def check_partition(model: onnx.ModelProto, stages: Any, refused: set[str], accel: str) -> None:
    nodes = list(model.graph.node)
    placed = [n for s in stages for n in s.nodes]
    assert sorted(placed) == list(range(len(nodes))), "every node in exactly one stage"
    reach = _reach(model)
    graph_inputs = {i.name for i in model.graph.input}
    available = set(graph_inputs)
    for k, stage in enumerate(stages):
        members = set(stage.nodes)
        if stage.backend == accel:
            assert not {nodes[n].name for n in members} & refused, "a refused node on the accelerator"
        # Convex: nothing outside the stage is both downstream of it and upstream of it.
        downstream = set().union(*(reach[n] for n in members)) - members
        upstream = {j for j in range(len(nodes)) if reach[j] & members} - members
        assert not downstream & upstream, f"stage {k} is not convex"
        # Topological: a stage's inputs exist before it runs.
        assert set(stage.inputs) <= available, f"stage {k} reads tensors not yet produced"
        available |= set(stage.outputs)
        for n in members:  # every tensor used later or returned leaves the stage
            for out in nodes[n].output:
                used_outside = any(out in nodes[j].input for j in range(len(nodes)) if j not in members)
                if used_outside or out in {o.name for o in model.graph.output}:
                    assert out in stage.outputs, f"stage {k} keeps {out} inside"


@pytest.mark.aarch64
@pytest.mark.parametrize("seed", range(12))
def test_random_dags_give_convex_topological_stages_that_compute_the_model(make_planner, options,
                                                                           seed: int) -> None:
    model = random_dag(seed, size=30)
    rng = np.random.default_rng(seed)
    refused = {f"n{i}" for i in range(30) if rng.random() < 0.3}
    planner, accel, _ = make_planner(model, refuse_nodes=tuple(sorted(refused)), input_shapes={"x0": (4096, 6)})
    for name in ("gpu", "hybrid", "auto"):
        layout = planner.layout(name)
        check_partition(model, layout.partition.stages, refused, accel.name)
    if seed < 4:  # run a few of them end to end
        executor = planner.compile(planner.layout("auto"), options)
        feeds = feeds_for(model, 5, seed=seed)
        assert_close_to(executor.run(feeds), ort_outputs(model, feeds))


@pytest.mark.aarch64
def test_partitions_are_deterministic(make_planner) -> None:
    model = random_dag(7, size=40)
    refuse = ("n3", "n11", "n12", "n30")
    first, _, _ = make_planner(model, refuse_nodes=refuse)
    second, _, _ = make_planner(model, refuse_nodes=refuse)
    for name in ("gpu", "hybrid", "auto"):
        assert first.layout(name) == second.layout(name)
        assert first.layout(name) == first.layout(name)


def test_an_island_too_small_for_its_copies_falls_back_to_cpu_a_big_one_stays(make_planner) -> None:
    model = chain(width=256)
    # The accelerator refuses both big MatMuls around a cheap Relu: a one-node island of little work.
    small, _, _ = make_planner(model, refuse_nodes=("mm0", "mm1", "relu1", "mm2"), input_shapes={"x": (64, 256)})
    assert [s.backend for s in small.layout("gpu").partition.stages] == ["cpu"]
    # The same shape of island around a MatMul (8 MFLOP) pays for its copies and stays.
    big, _, _ = make_planner(model, refuse_nodes=("mm0", "relu0", "relu1", "mm2"), input_shapes={"x": (64, 256)})
    stages = big.layout("gpu").partition.stages
    assert [s.backend for s in stages] == ["cpu", "restricted", "cpu"]
    assert [big.prepared.model.graph.node[n].name for n in stages[1].nodes] == ["mm1"]


def test_copies_are_counted_at_every_device_boundary_and_match_the_real_tensors(make_planner, options) -> None:
    model = skip_dag()
    planner, accel, _ = make_planner(model, refuse_nodes=("sigmoid",), input_shapes={"x": (32, 4, 8, 8)})
    layout = planner.layout("gpu")
    executor = planner.compile(layout, options)
    executor.run(feeds_for(model, 32))
    speed = planner.table.speeds[accel.name]
    seen: dict[str, int] = {}
    for executable in accel.compiled:
        seen.update(executable.seen_bytes)
    for stage in layout.partition.stages:
        if stage.backend == "cpu":
            assert stage.copy_bytes == 0 and stage.copy_s == 0.0, "host stages copy nothing"
            continue
        boundary = [*stage.inputs, *stage.outputs]
        assert stage.copy_bytes == sum(seen[t] for t in boundary), "estimated bytes = bytes that crossed"
        expected_s = sum(seen[t] / (speed.copy_gbps * 1e9) + speed.copy_latency_us * 1e-6 for t in boundary)
        assert stage.copy_s == pytest.approx(expected_s)


def test_several_outputs_and_a_shared_input_cut_across_stages(make_planner, options) -> None:
    model = skip_dag()
    # Refuse the side branch's middle: aux needs c1 (main branch) and t (cpu island).
    planner, _, _ = make_planner(model, refuse_nodes=("tanh_aux",), input_shapes={"x": (32, 4, 8, 8)})
    layout = planner.layout("gpu")
    assert len(layout.partition.stages) >= 2
    producers = {out for s in layout.partition.stages for out in s.outputs}
    assert {"logits", "aux"} <= producers
    executor = planner.compile(layout, options)
    feeds = feeds_for(model, 2)
    assert_close_to(executor.run(feeds), ort_outputs(model, feeds))


def test_a_node_no_backend_claims_is_named(make_planner) -> None:
    from backends.errors import UnsupportedNodesError
    from onnx import TensorProto, helper

    node = helper.make_node("Frobnicate", ["x"], ["y"], name="custom_op", domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    planner, _, _ = make_planner(model)
    for name in ("cpu", "gpu", "auto"):
        with pytest.raises(UnsupportedNodesError, match=r"custom_op \(Frobnicate\)"):
            planner.layout(name)
