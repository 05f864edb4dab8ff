"""``auto`` against a backend whose calibration lies: claimed 10x faster, 3x slower in fact.

The runtime is on its default configuration with the host's real calibration;
only the fake accelerator's figures are the lie. The estimate alone would put
the whole model there; the measured race must not, and a stale decision that
forces it in must be abandoned at run time from live latencies.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest

from auto_fakes import SLOWDOWN, lying_runtime
from planning_fakes import assert_close_to, feeds_for, ort_outputs, skip_dag


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "skip_dag.onnx"
    onnx.save(skip_dag(), str(path))
    return path


def test_the_estimate_prefers_the_liar_but_the_measured_race_does_not(tmp_path, monkeypatch, model_path) -> None:
    rt, slow = lying_runtime(tmp_path / "cache", monkeypatch)
    shapes = {"x": (8, 4, 8, 8)}
    planner = rt.planner(model_path, shapes)
    assert planner.layout("auto").partition.backends == ("liar",), "the lie convinces the cost model"
    model = rt.load(model_path, input_shapes=shapes)
    decision = model.report.decision
    assert decision is not None and decision.winner == "cpu" and model.backend == "cpu", decision
    cpu, liar_plan = decision.entry("cpu"), decision.entry("gpu")
    assert liar_plan.est_ms < cpu.est_ms, "estimated faster ..."
    assert liar_plan.measured_ms > cpu.measured_ms, "... measured slower"
    assert slow.runs > 0, "the liar was timed, not skipped"
    described = model.describe()["auto_decision"]
    assert {c["name"] for c in described["candidates"]} >= {"cpu", "gpu"}
    assert all("est_ms" in c and "measured_ms" in c for c in described["candidates"])
    feeds = feeds_for(skip_dag(), 8)
    assert_close_to(model.run(feeds), ort_outputs(skip_dag(), feeds))
    rt.close()


def test_the_decision_is_cached_per_model_and_shape(tmp_path, monkeypatch, model_path) -> None:
    from edge_runtime.plan_choice import CACHE_FILE

    rt, slow = lying_runtime(tmp_path / "cache", monkeypatch)
    first = rt.load(model_path, input_shapes={"x": (8, 4, 8, 8)}).report.decision
    runs = slow.runs
    again = rt.load(model_path, input_shapes={"x": (8, 4, 8, 8)}).report.decision
    assert again.where == "cache" and again.winner == first.winner and slow.runs == runs
    other = rt.load(model_path, input_shapes={"x": (2, 4, 8, 8)}).report.decision
    assert other.where == "in-process" and slow.runs > runs, "another shape is raced anew"
    assert len(json.loads((tmp_path / "cache" / CACHE_FILE).read_text())) == 2
    rt.close()


async def test_a_stale_decision_that_forces_the_liar_in_is_abandoned_live(tmp_path, monkeypatch, model_path,
                                                                          caplog) -> None:
    from edge_runtime.plan_choice import CACHE_FILE, decision_key
    from edge_runtime.scheduler import model_config
    from edge_runtime.scheduler.factory import scheduler_for

    rt, slow = lying_runtime(tmp_path / "cache", monkeypatch)
    # Rows enough that a run takes milliseconds: a candidate probed now and then can pay a sleeping
    # pool's wake-up (up to ~2 ms here) even on its second, timed run, which on 8 rows (~0.1 ms a run)
    # made the 3x slower liar look the faster side in a third to a half of runs on this Intel host.
    rows = 128
    shapes = {"x": (rows, 4, 8, 8)}
    key = decision_key(rt, onnx.load(str(model_path)), shapes, rt.compile_options())
    (tmp_path / "cache").mkdir(exist_ok=True)
    (tmp_path / "cache" / CACHE_FILE).write_text(json.dumps({key: {  # written under other conditions
        "winner": "gpu", "kind": "plan", "reason": "stale", "shapes": {"x": [rows, 4, 8, 8]},
        "candidates": [{"name": "gpu", "kind": "plan", "backends": ["liar"], "est_ms": 0.1, "measured_ms": 0.1},
                       {"name": "cpu", "kind": "plan", "backends": ["cpu"], "est_ms": 1.0, "measured_ms": 0.5}]}}))
    model = rt.load(model_path, input_shapes=shapes)
    assert model.backend == "liar" and model.report.decision.where == "cache"
    sched = scheduler_for(model, model_config({}), rt, None)  # the default configuration: fixed on auto
    assert set(sched.plans) == {"liar", "cpu"} and sched.recheck is not None
    feeds = feeds_for(skip_dag(), rows)
    want = ort_outputs(skip_dag(), feeds)
    ran = []
    with caplog.at_level(logging.INFO, logger="edge_runtime.scheduler.recheck"):
        async with sched:
            for _ in range(200):
                result = await sched.infer(feeds)
                ran.append(result.plan)
                assert_close_to(result.outputs, want)
    assert sched.abandoned() == {("liar", "slower"): 1}, sched.stats().get("recheck")
    assert ran[-20:] == ["cpu"] * 20, "once abandoned, the liar serves nothing"
    messages = [r.getMessage() for r in caplog.records if "abandoned" in r.getMessage()]
    assert len(messages) == 1 and "plan liar abandoned for cpu" in messages[0]
    speeds = sched.stats()["recheck"]["ms_per_row"]
    assert speeds["liar"] > 1.3 * speeds["cpu"], f"{SLOWDOWN}x slower by construction: {speeds}"
    rt.close()


def test_the_metric_counts_abandoned_plans() -> None:
    from types import SimpleNamespace

    from edge_runtime.server.metrics import ServerCollector

    scheduler = SimpleNamespace(abandoned=lambda: {("liar", "slower"): 1}, pending=0)
    served = SimpleNamespace(name="m", version=1, scheduler=scheduler, memory_bytes=0,
                             dispatcher=SimpleNamespace(pending=0))

    class Stats:
        def of(self, *args):
            return None

        def items(self):
            return []

    repository = SimpleNamespace(served=lambda: [served], services=None)
    collector = ServerCollector(Stats(), repository, lambda: {})
    samples = [s for family in collector._ours() for s in family.samples
               if s.name == "edge_runtime_plan_abandoned_total"]
    assert [(s.labels, s.value) for s in samples] == [
        ({"model": "m", "version": "1", "plan": "liar", "reason": "slower"}, 1)]


def test_a_shape_the_model_rejects_is_skipped_quietly(caplog) -> None:
    """A pooling model that needs sides of at least 100: the default side 64 is rejected at DEBUG."""
    from onnx import TensorProto, helper

    from backends.base import CompileOptions
    from backends.cpu import CPUBackend
    from edge_runtime.engine_choice import seeded_feeds
    from edge_runtime.plan_race import served_shapes

    graph = helper.make_graph([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[100, 100])], "pool",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    executable = CPUBackend().compile(proto, CompileOptions(intra_op_threads=1))
    with caplog.at_level(logging.DEBUG):
        shapes, how = served_shapes(proto, None, lambda s: executable.run(seeded_feeds(proto, s)))
    assert shapes == {"x": (1, 3, 224, 224)} and "224" in how
    assert any("rejected" in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert np.isfinite(executable.run(seeded_feeds(proto, shapes))["y"]).all()


def test_a_candidate_that_compiles_past_the_budget_drops_out_and_is_raced_again_later(
        tmp_path, monkeypatch, model_path) -> None:
    """A first kernel build can take minutes on a phone: loading must not wait for it. The candidate
    drops out with its reason, the host serves, the verdict is not cached, and what the late compile
    built is closed by its own thread."""
    import threading

    from edge_runtime import plan_race
    from edge_runtime.plan_choice import CACHE_FILE

    rt, slow = lying_runtime(tmp_path / "cache", monkeypatch)
    release, closed = threading.Event(), threading.Event()
    real_compile = slow.compile

    def stalled_compile(model, options):
        release.wait(30)  # held until the race has given up on it
        executable = real_compile(model, options)
        real_close = executable.close
        executable.close = lambda: (real_close(), closed.set())
        return executable

    monkeypatch.setattr(slow, "compile", stalled_compile)
    monkeypatch.setattr(plan_race, "COMPILE_BUDGET_S", 0.5)
    model = rt.load(model_path, input_shapes={"x": (8, 4, 8, 8)})
    decision = model.report.decision
    assert decision.winner == "cpu" and model.backend == "cpu"
    stalled = [e for e in decision.entries if e.note.startswith(plan_race.OVER_BUDGET)]
    assert stalled and all(e.measured_ms is None for e in stalled), decision.entries
    assert not (tmp_path / "cache" / CACHE_FILE).exists() or \
        not json.loads((tmp_path / "cache" / CACHE_FILE).read_text()), "a verdict missing a candidate is not kept"
    release.set()
    assert closed.wait(30), "the late compile's executable was not closed"
    assert slow.runs == 0, "an over-budget candidate is never timed"
    rt.close()
