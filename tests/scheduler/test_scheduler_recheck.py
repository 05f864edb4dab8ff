"""``PlanRecheck``: the served plan against its candidates, from the latencies it is told.

Pure decision logic (latencies given, not measured); the end-to-end case, a
slow plan forced in by a stale decision and abandoned while serving, is in
``tests/planning/test_auto_liar.py``.
"""

from __future__ import annotations

import logging

from edge_runtime.scheduler import model_config
from edge_runtime.scheduler.policy import Decision
from edge_runtime.scheduler.recheck import MIN_SAMPLES, PROBE_EVERY, PlanRecheck, plan_recheck


def _serve(recheck: PlanRecheck, ms: dict[str, float], decisions: int) -> list[str]:
    """Ask for the served plan ``decisions`` times; every run takes ``ms[plan]``."""
    ran = []
    for _ in range(decisions):
        decision = recheck.override(Decision(recheck.served, "policy"))
        recheck.observe(decision.plan, ms[decision.plan], 1, ok=True)
        ran.append(decision.plan)
    return ran


def test_candidates_are_probed_until_they_have_samples_then_left_alone() -> None:
    recheck = PlanRecheck("m", "gpu", ["cpu"])
    ran = _serve(recheck, {"gpu": 1.0, "cpu": 1.1}, PROBE_EVERY * (MIN_SAMPLES + 5))
    assert ran.count("cpu") == 2 * MIN_SAMPLES, "probed in pairs exactly until it has its timed samples"
    pairs = [i for i, plan in enumerate(ran) if plan == "cpu"]
    assert all(b == a + 1 for a, b in zip(pairs[::2], pairs[1::2])), "each probe's two runs back to back"
    assert recheck.served == "gpu" and not recheck.abandoned, "1.1x is within the margin"


def test_a_plan_slower_by_the_margin_is_abandoned_once_and_logged_once(caplog) -> None:
    recheck = PlanRecheck("m", "gpu", ["cpu", "hybrid"])
    with caplog.at_level(logging.INFO, logger="edge_runtime.scheduler.recheck"):
        ran = _serve(recheck, {"gpu": 3.0, "cpu": 1.0, "hybrid": 2.0}, 600)
    assert recheck.abandoned == {("gpu", "slower"): 1} and recheck.served == "cpu"
    assert ran[-50:] == ["cpu"] * 50
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "plan gpu abandoned for cpu" in caplog.records[0].getMessage()
    # The abandoned plan is never chosen again, even if a policy asks for it.
    assert recheck.override(Decision("gpu", "policy")).plan == "cpu"


def test_a_failing_plan_is_abandoned_as_failing() -> None:
    recheck = PlanRecheck("m", "gpu", ["cpu"])
    for step in range(400):
        decision = recheck.override(Decision(recheck.served, "policy"))
        recheck.observe(decision.plan, 1.0, 1, ok=decision.plan != "gpu")
        if recheck.abandoned:
            break
    assert recheck.abandoned == {("gpu", "failing"): 1}


def test_a_plan_the_operator_fixed_by_name_is_never_rechecked() -> None:
    from edge_runtime.scheduler.plans import CallablePlan

    plans = {name: CallablePlan(name, (backend,), dict) for name, backend in (("gpu", "opencl"), ("cpu", "cpu"))}
    assert plan_recheck("m", model_config({"scheduler": {"policy": "fixed", "plan": "gpu"}}), plans, "gpu") is None
    assert plan_recheck("m", model_config({"scheduler": {"policy": "threshold"}}), plans, "gpu") is None
    assert plan_recheck("m", model_config({}), {"gpu": plans["gpu"]}, "gpu") is None, "nothing to compare with"
    assert plan_recheck("m", model_config({}), plans, "gpu") is not None
    assert plan_recheck("m", model_config({"scheduler": {"policy": "cost"}}), plans, "gpu") is not None


def test_wake_up_spikes_of_a_rarely_run_candidate_do_not_hide_that_it_is_faster() -> None:
    """The first run of every probe of the candidate pays a pool's wake-up (30x its run), and one in three
    of the timed second runs too: the served plan, 3x slower on every run, is still abandoned (timing
    single probes it was not: every sample a wake-up); a candidate slower on every run still is not
    chosen."""
    recheck = PlanRecheck("m", "gpu", ["cpu"])
    runs = 0
    for _ in range(PROBE_EVERY * (MIN_SAMPLES + 5)):
        decision = recheck.override(Decision(recheck.served, "policy"))
        if decision.plan == "cpu" and recheck.served == "gpu":
            runs += 1
            ms = 9.0 if runs % 2 or runs % 6 == 0 else 0.3  # cold first runs, and every third warm one
        else:
            ms = {"gpu": 0.9, "cpu": 0.3}[decision.plan]
        recheck.observe(decision.plan, ms, 1, ok=True)
    assert recheck.abandoned == {("gpu", "slower"): 1} and recheck.served == "cpu"
    steady = PlanRecheck("m", "gpu", ["cpu"])
    ran = _serve(steady, {"gpu": 1.0, "cpu": 2.0}, PROBE_EVERY * (MIN_SAMPLES + 5))
    assert not steady.abandoned and ran[-20:] == ["gpu"] * 20
