"""Plan choice under pinned load readings, learning in the cost policy, fallbacks.

Which plan is which: ``cpu`` is the mlp on the ``cpu`` backend (ONNX Runtime).
``gpu`` is a *stand-in* (no GPU here): a second, independent ONNX Runtime
session of the same model, placed on the gpu worker. ``hybrid`` is a third
session labelled with opencl+cpu backends. Pure-decision tests use ``null``
backend executables, which do no numeric work.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from edge_runtime.errors import ConfigError
from edge_runtime.load_monitor import LoadReading
from edge_runtime.scheduler import ModelScheduler, model_config
from edge_runtime.scheduler.config import POLICIES, SchedulerConfig
from edge_runtime.scheduler.policy import REGISTRY, CostPolicy, DecisionContext, make_policy
from scheduler_fakes import InstrumentedPlan, compile_on, ort_oracle


def _x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 64)).astype(np.float32)


@pytest.fixture
def three_plans(mlp_proto, mlp_cpu, mlp_gpu_standin):
    return {
        "cpu": InstrumentedPlan("cpu", mlp_cpu),
        "gpu": InstrumentedPlan("gpu", mlp_gpu_standin, backends=("cpu",), device="gpu"),
        "hybrid": InstrumentedPlan("hybrid", compile_on("cpu", mlp_proto), backends=("opencl", "cpu")),
    }


@pytest.fixture(scope="module")
def null_plans(mlp_proto):
    exe = compile_on("null", mlp_proto)
    return {name: InstrumentedPlan(name, exe, backends=backends)
            for name, backends in (("cpu", ("cpu",)), ("gpu", ("opencl",)), ("hybrid", ("opencl", "cpu")))}


def test_every_configured_policy_name_has_a_class() -> None:
    assert sorted(REGISTRY) == sorted(POLICIES)


@pytest.mark.parametrize("with_hybrid", [True, False])
async def test_threshold_offloads_to_gpu_when_idle_and_avoids_it_when_busy(
        three_plans, monitor, mlp_proto, with_hybrid) -> None:
    plans = dict(three_plans) if with_hybrid else {k: three_plans[k] for k in ("cpu", "gpu")}
    sched = ModelScheduler("mlp", plans["cpu"].executable.inputs, plans,
                           model_config({"scheduler": {"policy": "threshold", "gpu_busy_threshold": 0.7}}),
                           monitor=monitor)
    oracle = ort_oracle(mlp_proto)
    async with sched:
        monitor.pin(gpu_busy=0.2)
        idle = await sched.infer({"input": _x(1)})
        monitor.pin(gpu_busy=0.9)
        busy = await sched.infer({"input": _x(2)})
        monitor.unpin()
        unknown = await sched.infer({"input": _x(3)})
    assert idle.plan == "gpu"
    assert busy.plan == ("hybrid" if with_hybrid else "cpu")
    assert busy.backends == (("opencl", "cpu") if with_hybrid else ("cpu",))
    assert unknown.plan == "gpu"  # our own occupancy estimate on an idle GPU is 0
    for seed, result in ((1, idle), (2, busy), (3, unknown)):
        np.testing.assert_allclose(result.outputs["logits"], oracle({"input": _x(seed)})["logits"],
                                   rtol=1e-5, atol=1e-6)
    assert len(plans["gpu"].calls) == 2
    stats = sched.stats()
    assert stats["plan:gpu"] == 2 and stats[f"plan:{busy.plan}"] == 1


def test_threshold_copes_with_missing_plans(null_plans) -> None:
    cfg = SchedulerConfig(policy="threshold")
    busy, idle = DecisionContext(LoadReading(gpu_busy=0.95)), DecisionContext(LoadReading(gpu_busy=0.1))
    only_cpu = make_policy(cfg, {"cpu": null_plans["cpu"]})
    assert only_cpu.choose(idle).plan == only_cpu.choose(busy).plan == "cpu"
    only_gpu = make_policy(cfg, {"gpu": null_plans["gpu"]})
    assert only_gpu.choose(busy).plan == "gpu"
    opencl_named = make_policy(cfg, {"opencl": null_plans["gpu"], "cpu": null_plans["cpu"]})
    assert opencl_named.choose(idle).plan == "opencl"  # a single-backend model offers its backend's name
    assert opencl_named.choose(busy).plan == "cpu"


def test_fixed_policy_takes_the_named_plan_and_rejects_unknown_names(null_plans) -> None:
    reading = DecisionContext(LoadReading(gpu_busy=0.0, cpu_busy=1.0))
    assert make_policy(SchedulerConfig(policy="fixed", plan="cpu"), null_plans).choose(reading).plan == "cpu"
    auto = make_policy(SchedulerConfig(policy="fixed"), null_plans, default_plan="hybrid")
    assert auto.choose(reading).plan == "hybrid"
    with pytest.raises(ConfigError, match="plan 'tpu' is not a plan of this model"):
        make_policy(SchedulerConfig(policy="fixed", plan="tpu"), null_plans)


def _simulate(policy: CostPolicy, true_ms: dict[str, float], decisions: int) -> Counter:
    chosen: Counter = Counter()
    for _ in range(decisions):
        decision = policy.choose(DecisionContext(LoadReading()))
        chosen[decision.plan] += 1
        policy.observe(decision.plan, true_ms[decision.plan], 1, LoadReading())
    return chosen


def test_cost_policy_learns_avoids_a_slowed_plan_and_exploration_finds_it_fast_again(null_plans) -> None:
    plans = {k: null_plans[k] for k in ("cpu", "gpu")}
    policy = CostPolicy(SchedulerConfig(policy="cost", explore_fraction=0.1, seed=7), plans)
    warm = _simulate(policy, {"cpu": 4.0, "gpu": 1.0}, 200)
    assert warm["gpu"] > 0.8 * 200
    slowed = _simulate(policy, {"cpu": 4.0, "gpu": 20.0}, 400)
    assert slowed["cpu"] > 0.8 * 400
    assert 10 <= slowed["gpu"] <= 80  # only exploration still tries it (10 % of decisions)
    assert policy.estimates_ms()["gpu"] > 10.0
    recovered = _simulate(policy, {"cpu": 4.0, "gpu": 1.0}, 300)
    assert recovered["gpu"] > 0.7 * 300
    # Same seed, same decisions: exploration is reproducible.
    replay = CostPolicy(SchedulerConfig(policy="cost", explore_fraction=0.1, seed=7), plans)
    assert _simulate(replay, {"cpu": 4.0, "gpu": 1.0}, 200) == warm


def test_cost_policy_scales_estimates_by_competing_load_and_queue_wait(null_plans) -> None:
    plans = {k: null_plans[k] for k in ("cpu", "gpu")}
    policy = CostPolicy(SchedulerConfig(policy="cost", explore_fraction=0.0), plans)
    policy.observe("cpu", 2.0, 1, LoadReading(cpu_busy=0.0))
    policy.observe("gpu", 3.0, 1, LoadReading(gpu_busy=0.0))
    assert policy.choose(DecisionContext(LoadReading(cpu_busy=0.1))).plan == "cpu"
    assert policy.choose(DecisionContext(LoadReading(cpu_busy=0.8))).plan == "gpu"  # cpu x5
    # Our own CPU use is not competition: the same total with own=0.7 leaves cpu cheap.
    assert policy.choose(DecisionContext(LoadReading(cpu_busy=0.8, cpu_busy_own=0.7))).plan == "cpu"
    assert policy.choose(DecisionContext(LoadReading(), queue_wait_runs={"cpu": 1.0})).plan == "gpu"
    # A run measured under load is stored as its unloaded cost.
    policy.observe("cpu", 10.0, 1, LoadReading(cpu_busy=0.8))
    assert policy.estimates_ms()["cpu"] == pytest.approx(2.0)


def test_cost_policy_starts_from_the_cost_model_prior_or_measures_first(mlp_proto) -> None:
    exe = compile_on("null", mlp_proto)
    cheap_gpu = {"cpu": InstrumentedPlan("cpu", exe, estimated_ms=5.0),
                 "gpu": InstrumentedPlan("gpu", exe, backends=("opencl",), estimated_ms=1.0)}
    policy = CostPolicy(SchedulerConfig(policy="cost", explore_fraction=0.0), cheap_gpu)
    assert policy.choose(DecisionContext()).plan == "gpu"
    unknown = {"cpu": InstrumentedPlan("cpu", exe), "gpu": InstrumentedPlan("gpu", exe, backends=("opencl",))}
    policy = CostPolicy(SchedulerConfig(policy="cost", explore_fraction=0.0), unknown)
    first = policy.choose(DecisionContext())
    assert first.explored and first.reason.startswith("no estimate")
    policy.observe(first.plan, 1.0, 1, LoadReading())
    assert policy.choose(DecisionContext()).plan != first.plan  # the other one is measured next


async def test_cost_policy_on_real_runs_avoids_the_plan_made_slow(mlp_cpu, mlp_gpu_standin, monitor) -> None:
    plans = {"cpu": InstrumentedPlan("cpu", mlp_cpu),
             "gpu": InstrumentedPlan("gpu", mlp_gpu_standin, device="gpu", delay_s=0.03)}  # made slow
    sched = ModelScheduler("mlp", mlp_cpu.inputs, plans,
                           model_config({"scheduler": {"policy": "cost", "explore_fraction": 0.2, "seed": 3}}),
                           monitor=monitor)
    async with sched:
        results = [await sched.infer({"input": _x(i)}) for i in range(40)]
    chosen = Counter(r.plan for r in results)
    stats = sched.stats()
    assert chosen["cpu"] >= 28
    assert 2 <= chosen["gpu"] <= 14  # the first measurement plus exploration re-tries
    assert stats["explored"] >= 2
    assert stats["estimates_ms"]["gpu"] > 5 * stats["estimates_ms"]["cpu"]
    gpu_runs = [r for r in results if r.plan == "gpu"]
    assert all(r.compute_ms >= 30 for r in gpu_runs)


async def test_failing_plan_falls_back_to_cpu_and_is_counted(mlp_cpu, mlp_gpu_standin, mlp_proto, monitor) -> None:
    plans = {"cpu": InstrumentedPlan("cpu", mlp_cpu),
             "gpu": InstrumentedPlan("gpu", mlp_gpu_standin, device="gpu", fail=True)}
    sched = ModelScheduler("mlp", mlp_cpu.inputs, plans, model_config({"scheduler": {"policy": "threshold"}}),
                           monitor=monitor)
    async with sched:
        result = await sched.infer({"input": _x(5)})
    assert result.plan == "cpu" and result.backends == ("cpu",)
    assert result.fallback is not None and "device lost" in result.fallback
    assert not result.retried and not result.ran_twice  # a device failure never ran the request elsewhere
    np.testing.assert_allclose(result.outputs["logits"], ort_oracle(mlp_proto)({"input": _x(5)})["logits"],
                               rtol=1e-5, atol=1e-6)
    stats = sched.stats()
    assert stats["fallbacks"] == 1 and stats["fallback:gpu"] == 1
    assert len(plans["gpu"].calls) == 1 and len(plans["cpu"].calls) == 1


class FailingCloudPlan:
    """A cloud plan whose call fails with ``error``, as the cloud client raises it."""

    name, backends, device = "cloud", ("cloud",), "cloud"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def run(self, feeds):
        raise self.error


def _cloud_error(message: str, **facts) -> Exception:
    from edge_runtime.cloud.client import CloudCallError

    return CloudCallError(message, **facts)


@pytest.mark.parametrize("error, retried, ran_twice", [
    (_cloud_error("no answer after sending", kind="timeout", sent=True, attempts=1), False, True),
    (_cloud_error("could not connect", kind="refused", sent=False, attempts=3), True, False),
    (_cloud_error("HTTP 503", kind="http_error", sent=True, attempts=1, status=503), False, False),
])
async def test_a_failed_cloud_plan_reruns_on_cpu_saying_if_it_may_have_run_twice(
        mlp_cpu, mlp_proto, error: Exception, retried: bool, ran_twice: bool) -> None:
    plans = {"cpu": InstrumentedPlan("cpu", mlp_cpu), "cloud": FailingCloudPlan(error)}
    sched = ModelScheduler("mlp", mlp_cpu.inputs, plans,
                           model_config({"scheduler": {"policy": "fixed", "plan": "cloud"}}))
    async with sched:
        result = await sched.infer({"input": _x(6)})
    assert (result.plan, result.retried, result.ran_twice) == ("cpu", retried, ran_twice)
    assert result.fallback == f"plan 'cloud' failed: {error}"
    np.testing.assert_allclose(result.outputs["logits"], ort_oracle(mlp_proto)({"input": _x(6)})["logits"],
                               rtol=1e-5, atol=1e-6)


def test_cost_policy_avoids_a_plan_that_failed(null_plans) -> None:
    plans = {k: null_plans[k] for k in ("cpu", "gpu")}
    policy = CostPolicy(SchedulerConfig(policy="cost", explore_fraction=0.0), plans)
    policy.observe("cpu", 3.0, 1, LoadReading())
    assert policy.choose(DecisionContext()).plan == "gpu"  # not measured yet
    policy.observe("gpu", 0.0, 1, LoadReading(), ok=False)  # it failed before any measurement
    assert {policy.choose(DecisionContext()).plan for _ in range(20)} == {"cpu"}
    assert policy.estimates_ms()["gpu"] == pytest.approx(6.0)
