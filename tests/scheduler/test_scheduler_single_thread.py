"""A small cpu model's runs go to its pool session or a one-thread session, whichever is measured
cheaper for their input shapes (``scheduler/single_thread.py``).

The switch's rules are checked with runs that advance a fake clock (what a run costs is set
by the test, so nothing depends on this machine's speed); the daemon's wiring is checked on
the default configuration with real sessions and real timings: which session wins is this
machine's business, but the answers must equal plain ONNX Runtime's, both sessions must have
been measured, and the session the switch serves by must be the one it measured cheaper.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from edge_runtime.errors import ConfigError
from edge_runtime.scheduler import model_config
from edge_runtime.scheduler.factory import scheduler_for, serving_options
from edge_runtime.scheduler.single_thread import EXPLORE_EVERY, MAX_RUN_MS, MIN_RUNS, SingleThreadSwitch
from scheduler_fakes import assert_like_ort


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _switch(pool_ms_per_row: float, single_ms_per_row: float) -> tuple[SingleThreadSwitch, list[str]]:
    """A switch over two fake sessions whose runs cost the given ms per row on a fake clock; the
    list records which session ran each call."""
    clock, ran = _Clock(), []

    def session(name: str, ms_per_row: float):
        def run(feeds):
            rows = feeds["input"].shape[0]
            clock.now += ms_per_row * rows / 1e3
            ran.append(name)
            return {"output": feeds["input"] * 2.0, "by": name}
        return run

    return SingleThreadSwitch(session("pool", pool_ms_per_row), session("single", single_ms_per_row),
                              clock=clock), ran


def _feeds(rows: int) -> dict[str, np.ndarray]:
    return {"input": np.ones((rows, 4), np.float32)}


def test_a_shape_cheaper_on_one_thread_is_served_there_after_both_are_measured() -> None:
    switch, ran = _switch(pool_ms_per_row=1.0, single_ms_per_row=0.8)
    warm = 2 * (MIN_RUNS + 1)  # each session's first run of a shape is not counted
    for _ in range(warm + 20):
        out = switch(_feeds(1))
        np.testing.assert_array_equal(out["output"], np.full((1, 4), 2.0, np.float32))
    assert ran[:MIN_RUNS + 1] == ["pool"] * (MIN_RUNS + 1)  # pool first: the model's own session
    assert ran[MIN_RUNS + 1:warm] == ["single"] * (MIN_RUNS + 1)
    assert ran[warm:] == ["single"] * 20
    assert switch.choice(_feeds(1)) == "single"
    snapshot = switch.snapshot()
    assert snapshot["runs"] == {"pool": MIN_RUNS + 1, "single": MIN_RUNS + 1 + 20}
    assert snapshot["ms_per_row"]["input:1x4"] == {"pool": pytest.approx(1.0), "single": pytest.approx(0.8)}


def test_shapes_are_decided_apart_and_a_batch_cheaper_on_the_pool_stays_there() -> None:
    switch, ran = _switch(pool_ms_per_row=0.3, single_ms_per_row=0.5)  # a batch splits well over threads
    for _ in range(2 * (MIN_RUNS + 1) + 10):
        switch(_feeds(8))
    assert switch.choice(_feeds(8)) == "pool" and ran[-10:] == ["pool"] * 10
    assert switch.choice(_feeds(1)) is None  # a shape never seen is not decided by another's figures
    assert switch(_feeds(1))["by"] == "pool"


def test_a_decided_shape_is_measured_again_on_the_other_session_once_in_explore_every_runs() -> None:
    switch, ran = _switch(pool_ms_per_row=1.0, single_ms_per_row=0.8)
    warm = 2 * (MIN_RUNS + 1)
    for _ in range(warm + 3 * EXPLORE_EVERY):
        switch(_feeds(1))
    decided = ran[warm:]
    assert decided.count("pool") == 3 and decided.count("single") == 3 * EXPLORE_EVERY - 3
    assert [i for i, name in enumerate(decided) if name == "pool"] == [
        EXPLORE_EVERY - 1, 2 * EXPLORE_EVERY - 1, 3 * EXPLORE_EVERY - 1]


def test_a_slower_one_thread_session_is_abandoned_when_its_runs_get_dearer() -> None:
    clock, ran = _Clock(), []
    cost = {"pool": 1.0, "single": 0.8}

    def session(name: str):
        def run(feeds):
            clock.now += cost[name] / 1e3
            ran.append(name)
            return {}
        return run

    switch = SingleThreadSwitch(session("pool"), session("single"), clock=clock)
    for _ in range(2 * (MIN_RUNS + 1)):
        switch(_feeds(1))
    assert switch.choice(_feeds(1)) == "single"
    cost["single"] = 3.0  # other work took this core: one thread now loses
    for _ in range(12 * EXPLORE_EVERY):
        switch(_feeds(1))
    assert switch.choice(_feeds(1)) == "pool"


class _BuiltModel:
    """A stand-in for the one-thread ``Model`` the factory builds: its run and whether it was closed."""

    def __init__(self, ran: list[str], clock: _Clock) -> None:
        self.ran, self.clock, self.closed = ran, clock, False

    def _run_validated(self, feeds):
        self.clock.now += 0.5e-3
        self.ran.append("single")
        return {"output": feeds["input"] * 2.0}

    def close(self) -> None:
        self.closed = True


def _lazy(pool_ms: float) -> tuple[SingleThreadSwitch, list[str], list[_BuiltModel]]:
    ran, built, clock = [], [], _Clock()

    def pool(feeds):
        clock.now += pool_ms / 1e3
        ran.append("pool")
        return {"output": feeds["input"] * 2.0}

    def build():
        built.append(_BuiltModel(ran, clock))
        return built[-1]

    return SingleThreadSwitch(pool, build=build, clock=clock), ran, built


def test_a_shape_whose_pool_runs_are_long_never_builds_or_runs_a_one_thread_session() -> None:
    switch, ran, built = _lazy(pool_ms=MAX_RUN_MS * 2)
    for _ in range(3 * EXPLORE_EVERY):
        switch(_feeds(1))
    assert set(ran) == {"pool"} and built == [] and switch.single_model is None
    assert switch.choice(_feeds(1)) is None


def test_the_one_thread_session_is_built_once_when_a_shape_proves_short_and_closed_with_the_switch() -> None:
    switch, ran, built = _lazy(pool_ms=1.0)
    for _ in range(MIN_RUNS + 1):
        switch(_feeds(1))
    assert switch.wait_ready(30.0), switch.build_error
    for _ in range(MIN_RUNS + 5):
        np.testing.assert_array_equal(switch(_feeds(1))["output"], np.full((1, 4), 2.0, np.float32))
    assert len(built) == 1 and switch.single_model is built[0]
    assert ran[:MIN_RUNS + 1] == ["pool"] * (MIN_RUNS + 1)
    assert "single" in ran[MIN_RUNS + 1:]  # measured on one thread once it was there
    switch.close()
    assert built[0].closed and switch.single_model is None
    assert switch(_feeds(1))["output"].shape == (1, 4)  # after close, the pool answers


def _served(runtime, path, scheduler: dict | None = None):
    config = model_config({"batching": {"max_batch_size": 8}, **({"scheduler": scheduler} if scheduler else {})})
    model = runtime.load(path, backend="cpu", options=serving_options(runtime, config))
    return scheduler_for(model, config, runtime, None), model


async def test_default_configuration_serves_a_small_cnn_with_both_sessions_measured(runtime, cnn) -> None:
    """What the daemon does: the factory's scheduler on the default configuration, real runs and timings."""
    path, proto = cnn
    sched, model = _served(runtime, path)
    switch = sched.single_thread
    assert switch is not None
    rng = np.random.default_rng(12)
    feeds = [{"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(24)]
    key = "input:1x3x32x32"
    try:
        async with sched:
            # One-row runs, one at a time; the pool is measured first.
            results = [await sched.infer(feed) for feed in feeds[:MIN_RUNS + 1]]
            pool_ms = switch.snapshot()["ms_per_row"][key]["pool"]
            short = pool_ms <= MAX_RUN_MS  # the CNN's run is far under it, unless this machine is swamped
            if short:  # the one-thread session is being built
                assert await asyncio.to_thread(switch.wait_ready, 60.0), switch.build_error
                session = switch.single_model.executable._session  # ORT's session behind the one-thread side
                assert session.get_session_options().intra_op_num_threads == 1
            results += [await sched.infer(feed) for feed in feeds[MIN_RUNS + 1:]]
            stats = sched.stats()["single_thread"]
            choice = switch.choice(feeds[0])
    finally:
        sched.discard()
        model.close()
    assert switch.single_model is None  # closed with the scheduler (or never built)
    assert_like_ort(proto, feeds, results, "probabilities")
    measured = stats["ms_per_row"][key]
    if not short:
        assert stats["runs"]["single"] == 0 and "single" not in measured, (pool_ms, stats)
        return
    assert stats["runs"]["pool"] >= MIN_RUNS + 1 and stats["runs"]["single"] >= MIN_RUNS + 1, stats
    assert set(measured) == {"pool", "single"}, measured
    if measured["pool"] <= MAX_RUN_MS:  # still short: served by the session measured cheaper
        assert choice == min(measured, key=measured.__getitem__), (choice, measured)


def test_no_one_thread_session_when_turned_off_on_one_core_or_for_a_large_model(runtime, cnn, monkeypatch,
                                                                               tmp_path) -> None:
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime
    from edge_runtime.scheduler import factory

    path, _ = cnn
    sched, model = _served(runtime, path, {"single_thread": "never"})
    assert sched.single_thread is None and "single_thread" not in sched.stats()
    sched.discard()
    model.close()
    one_core = Runtime(RuntimeConfig(cache_dir=tmp_path, intra_op_threads=1, probe_opencl=False))
    try:
        sched, model = _served(one_core, path)
        assert sched.single_thread is None  # its pool session already has one thread
        sched.discard()
        model.close()
    finally:
        one_core.close()
    monkeypatch.setattr(factory, "TWIN_MAX_BYTES", path.stat().st_size - 1)
    sched, model = _served(runtime, path)
    assert sched.single_thread is None
    sched.discard()
    model.close()


@pytest.mark.parametrize("bad, message", [
    ("always", r"single_thread must be one of \('auto', 'never'\), got 'always'"),
    (1, r"\[scheduler\]\.single_thread: expected str, got 1"),
])
def test_single_thread_mode_outside_its_choices_is_a_config_error(bad, message) -> None:
    with pytest.raises(ConfigError, match=message):
        model_config({"scheduler": {"single_thread": bad}})


def test_the_heap_is_trimmed_where_the_c_library_can() -> None:
    """glibc (Linux, CI's Debian) has malloc_trim; other C libraries are left as they are."""
    import platform

    from edge_runtime.heap_trim import release_free_heap

    assert release_free_heap() is (platform.libc_ver()[0] == "glibc")
