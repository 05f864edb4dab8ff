"""The spin policy (``scheduler/spin.py``): served CPU pool threads spin while a run is in flight, never idle.

What is checked: the settings each ``[scheduler] spin`` mode gives the ONNX Runtime
session that serves the model (read back from the session itself); that the policy
reports spinning while runs are in flight and not once the model is idle; that a
daemon-like process serving a CNN under load then idling for two seconds spends
almost no CPU time while idle (process CPU time, a generous bound: no timing of
the model itself: ORT's own pool also stops spinning a little after a run, so this guards
against a policy that keeps a pool spinning, as the ``load`` mode's idle figure in
``tools/bench_server.py`` measures the rest); and that the answers of the spinning, batching session equal
ONNX Runtime's own, one request at a time.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.errors import ConfigError
from edge_runtime.scheduler import model_config
from edge_runtime.scheduler.factory import scheduler_for, serving_options
from edge_runtime.scheduler.spin import SPIN_WAIT_US, spin_settings
from scheduler_fakes import assert_like_ort, ort_oracle, pool_model

IDLE_S = 2.0
IDLE_CPU_BOUND_S = 0.1  # 5 % of one core over the idle window; a spinning pool takes a whole core


def _entry(sched, key: str) -> str:
    session = pool_model(sched.plans["cpu"]).executable._session  # ORT's session behind the plan
    return session.get_session_options().get_session_config_entry(key)


def _served(runtime, path: Path, spin: str | None = None, spin_wait_us: int | None = None, **batching):
    scheduler = {"spin": spin} if spin else {}
    if spin_wait_us is not None:
        scheduler["spin_wait_us"] = spin_wait_us
    data = {"scheduler": scheduler, "batching": batching}
    config = model_config(data)
    model = runtime.load(path, backend="cpu", options=serving_options(runtime, config))
    return scheduler_for(model, config, runtime, None), model


@pytest.mark.parametrize("spin, wait_us, allow, stop, duration", [
    (None, None, "1", "1", str(SPIN_WAIT_US)),  # the default: "load", one wait spinning at most 1 ms
    ("load", None, "1", "1", str(SPIN_WAIT_US)),
    ("load", 100, "1", "1", "100"),  # a bound chosen per model reaches the session
    ("load", 0, "1", "1", None),  # 0: ORT's own spin per wait, no entry
    ("never", None, "0", None, None),
    ("always", None, "1", None, None),
])
def test_each_spin_mode_reaches_the_onnxruntime_session(runtime, cnn, spin, wait_us, allow, stop, duration) -> None:
    sched, model = _served(runtime, cnn[0], spin, wait_us)
    try:
        assert _entry(sched, "session.intra_op.allow_spinning") == allow
        if stop is not None:
            assert _entry(sched, "session.force_spinning_stop") == stop
        else:  # ORT's own behaviour after a run is kept: no stop entry
            with pytest.raises(Exception):
                _entry(sched, "session.force_spinning_stop")
        if duration is not None:
            assert _entry(sched, "session.intra_op.spin_duration_us") == duration
        else:  # no bound ("never", "always", or 0): ORT's own spin per wait
            with pytest.raises(Exception):
                _entry(sched, "session.intra_op.spin_duration_us")
    finally:
        sched.discard()
        model.close()


@pytest.mark.parametrize("wait_us, message", [
    (-1, r"spin_wait_us must be an integer in 0\.\.100000 \(microseconds\), got -1"),
    (100_001, r"spin_wait_us must be an integer in 0\.\.100000 \(microseconds\), got 100001"),
    (2.5, r"spin_wait_us: expected int, got 2.5"),
])
def test_spin_wait_outside_its_range_is_a_config_error(wait_us, message) -> None:
    with pytest.raises(ConfigError, match=message):
        model_config({"scheduler": {"spin_wait_us": wait_us}})


def test_unknown_spin_mode_is_a_config_error_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"spin must be one of .*'load'.*got 'sometimes'"):
        model_config({"scheduler": {"spin": "sometimes"}})


def test_settings_match_only_the_options_they_produced(runtime) -> None:
    load, never = spin_settings("load"), spin_settings("never")
    options = load.apply(runtime.compile_options())
    assert load.matches(options) and not never.matches(options) and not load.matches(None)


async def test_spinning_is_on_while_runs_are_in_flight_and_off_once_idle(runtime, cnn) -> None:
    path, proto = cnn
    sched, model = _served(runtime, path, max_batch_size=8, max_queue_delay_us=2000)
    rng = np.random.default_rng(5)
    feeds = [{"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(24)]
    try:
        async with sched:
            assert sched.stats()["spinning"] is False  # idle before any request
            tasks = [asyncio.create_task(sched.infer(f)) for f in feeds]
            await asyncio.sleep(0)  # the first request is dispatched at once (the model was idle)
            assert sched.in_flight > 0 and sched.stats()["spinning"] is True
            results = await asyncio.gather(*tasks)
            assert sched.stats()["spinning"] is False
    finally:
        model.close()
    assert_like_ort(proto, feeds, results, "probabilities")
    assert max(r.batch_size for r in results) > 1, "requests were never batched together"


async def test_an_idle_served_model_uses_almost_no_cpu_after_load(runtime, cnn) -> None:
    path, _ = cnn
    sched, model = _served(runtime, path, max_batch_size=8, max_queue_delay_us=1000)
    x = np.random.default_rng(6).standard_normal((1, 3, 32, 32)).astype(np.float32)
    try:
        async with sched:
            busy_until = time.monotonic() + 1.0  # a second of closed-loop load at concurrency 8

            async def client() -> None:
                while time.monotonic() < busy_until:
                    await sched.infer({"input": x})

            await asyncio.gather(*(client() for _ in range(8)))
            assert sched.stats()["success"] > 8
            await asyncio.sleep(0.2)  # the last answers are delivered
            before = time.process_time()  # every thread of this process: the loop and ORT's pool
            await asyncio.sleep(IDLE_S)
            idle_cpu_s = time.process_time() - before
    finally:
        model.close()
    assert idle_cpu_s < IDLE_CPU_BOUND_S, f"{idle_cpu_s:.3f} s of CPU over {IDLE_S} s idle"


def _twin_served(runtime, path: Path, monitor):
    # One-row runs may go to the one-thread session (single_thread.py), past the spin switch this
    # test counts: off here, so every run is the spin policy's.
    config = model_config({"batching": {"max_batch_size": 8, "max_queue_delay_us": 2000},
                           "scheduler": {"single_thread": "never"}})
    model = runtime.load(path, backend="cpu", options=serving_options(runtime, config))
    return scheduler_for(model, config, runtime, monitor), model


async def test_under_foreign_cpu_load_runs_go_to_the_quiet_twin_and_back_when_it_ends(runtime, cnn, monitor) -> None:
    path, proto = cnn
    sched, model = _twin_served(runtime, path, monitor)
    switch = sched.spin_switch
    assert switch is not None and switch.quiet_model is not None
    quiet_session = switch.quiet_model.executable._session  # ORT's session behind the twin
    assert quiet_session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    oracle = ort_oracle(proto)
    rng = np.random.default_rng(8)
    feeds = [{"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(6)]
    try:
        async with sched:
            loaded = dict(sched.stats()["spin_runs"])  # the load-time batching experiment's runs
            monitor.pin(cpu_busy=0.9, cpu_busy_own=0.1)  # others hold 80 % of the machine
            busy = await asyncio.gather(*(sched.infer(f) for f in feeds))
            runs = sched.stats()["spin_runs"]
            assert runs["spinning"] == loaded["spinning"] and runs["quiet"] > loaded["quiet"]
            monitor.pin(cpu_busy=0.3, cpu_busy_own=0.2)  # the others have gone quiet
            calm = await asyncio.gather(*(sched.infer(f) for f in feeds))
            after = sched.stats()["spin_runs"]
            assert after["quiet"] == runs["quiet"] and after["spinning"] > runs["spinning"]
    finally:
        model.close()
    for feed, a, b in zip(feeds, busy, calm):
        want = oracle(feed)["probabilities"]
        np.testing.assert_allclose(a.outputs["probabilities"], want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(b.outputs["probabilities"], want, rtol=1e-4, atol=1e-5)


def test_no_twin_for_a_large_model_or_without_a_monitor(runtime, cnn, monitor, monkeypatch) -> None:
    from edge_runtime.scheduler import factory

    path, _ = cnn
    sched, model = _twin_served(runtime, path, None)
    assert sched.spin_switch is None and "spin_runs" not in sched.stats()
    sched.discard()
    monkeypatch.setattr(factory, "TWIN_MAX_BYTES", path.stat().st_size - 1)
    sched, model = _twin_served(runtime, path, monitor)
    try:
        assert sched.spin_switch is None
        assert _entry(sched, "session.force_spinning_stop") == "1"  # it still spins within runs only
    finally:
        sched.discard()
        model.close()
