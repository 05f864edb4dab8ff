"""The runtime-core pieces of residency: result cache, memory budget, warm-up (no server).

Clocks are fakes the tests advance; nothing sleeps.
"""

from __future__ import annotations

import numpy as np
import pytest

from backends.base import TensorSpec
from edge_runtime.errors import ConfigError, InvalidInputError, QueueFullError
from edge_runtime.memory_budget import MemoryBudget, memory_config
from edge_runtime.result_cache import ResultCache, ResultCacheConfig, result_cache_config
from edge_runtime.warmup import WarmupConfig, warm_up, warmup_config


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def feeds(seed: int, n: int = 4) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, n)).astype(np.float32)}


# -- result cache ------------------------------------------------------------------------------
def test_the_key_changes_with_any_byte_dtype_shape_model_or_version() -> None:
    base = feeds(0)
    key = ResultCache.key("m", 1, base)
    flipped = base["x"].copy()
    flipped.view(np.uint8)[0, 0] ^= 1  # one bit
    variants = [ResultCache.key("m", 1, {"x": flipped}), ResultCache.key("m", 2, base),
                ResultCache.key("n", 1, base), ResultCache.key("m", 1, {"x": base["x"].astype(np.float64)}),
                ResultCache.key("m", 1, {"x": base["x"].reshape(4, 1)}), ResultCache.key("m", 1, {"y": base["x"]})]
    assert len({key, *variants}) == 1 + len(variants)
    assert ResultCache.key("m", 1, {"x": base["x"].copy()}) == key
    assert ResultCache.key("m", 1, {"x": np.asfortranarray(np.ones((3, 2), np.float32))}) == \
        ResultCache.key("m", 1, {"x": np.ones((3, 2), np.float32)})


def test_hits_return_the_stored_bytes_read_only_and_count() -> None:
    cache = ResultCache(ResultCacheConfig(enabled=True))
    outputs = {"y": np.arange(6, dtype=np.float32).reshape(2, 3)}
    key = ResultCache.key("m", 1, feeds(0))
    assert cache.get(key) is None
    assert cache.put(key, outputs)
    outputs["y"][0, 0] = 99  # the caller reusing its buffer must not change the cached copy
    hit = cache.get(key)
    assert hit is not None and hit["y"].tobytes() == np.arange(6, dtype=np.float32).tobytes()
    assert not hit["y"].flags.writeable
    assert cache.snapshot() == {"entries": 1, "bytes": 24, "hits": 1, "misses": 1, "evictions": 0}


def test_lru_byte_budget_entry_limit_and_ttl() -> None:
    clock = Clock()
    cache = ResultCache(ResultCacheConfig(enabled=True, max_bytes=100, max_entries=3, ttl_s=10.0), clock)
    out = {"y": np.zeros(10, np.float32)}  # 40 bytes
    keys = [ResultCache.key("m", 1, feeds(i)) for i in range(4)]
    cache.put(keys[0], out)
    cache.put(keys[1], out)
    assert cache.get(keys[0]) is not None  # 0 is now the most recent
    cache.put(keys[2], out)  # 120 bytes > 100: the least recent (1) goes
    assert cache.get(keys[1]) is None and cache.get(keys[0]) is not None and cache.get(keys[2]) is not None
    assert not cache.put(keys[3], {"y": np.zeros(30, np.float32)})  # alone over the budget: not stored
    clock.now = 10.5
    assert cache.get(keys[0]) is None and cache.snapshot()["entries"] == 1  # expired
    small = ResultCache(ResultCacheConfig(enabled=True, max_entries=2))
    for k in keys[:3]:
        small.put(k, {"y": np.zeros(1, np.float32)})
    assert small.snapshot()["entries"] == 2 and small.get(keys[0]) is None


def test_result_cache_config_is_off_by_default_and_checked() -> None:
    assert not result_cache_config(None, "m/config.toml").enabled
    with pytest.raises(ConfigError, match=r"m/config.toml: \[result_cache\].*unknown key"):
        result_cache_config({"enable": True}, "m/config.toml")
    with pytest.raises(ConfigError, match="max_bytes"):
        result_cache_config({"max_bytes": 0}, "m/config.toml")


# -- memory budget -----------------------------------------------------------------------------
def test_make_room_unloads_least_recently_used_idle_models_only() -> None:
    clock = Clock()
    budget = MemoryBudget(300, clock)
    for t, owner in enumerate(("a", "b", "c")):
        clock.now = t
        budget.charge(owner, 100)
    clock.now = 5
    with budget.using("a"):  # a is now the most recent and busy
        assert budget.make_room(100, "d") == ["b"]  # the LRU idle one, only as many as needed
        budget.release("b")
        budget.charge("d", 100)
        assert budget.make_room(200, "e") == ["c", "d"]  # a is busy: skipped although it is older than d
        budget.release("c"), budget.release("d")
        budget.charge("e", 200)
        with pytest.raises(QueueFullError, match=r"busy models \['a'\]"):
            budget.make_room(250, "f")  # freeing idle e is not enough, and a is busy
        assert budget.is_busy("a") and budget.used_bytes == 300  # nothing was given up
    assert not budget.is_busy("a")
    assert sorted(budget.make_room(250, "f")) == ["a", "e"]  # idle now, a may go
    with pytest.raises(QueueFullError, match="more than the whole budget"):
        budget.make_room(301, "g")
    assert MemoryBudget(0).make_room(10**12, "x") == []  # no budget: never unload


def test_a_reload_counts_its_own_charge_as_freed() -> None:
    budget = MemoryBudget(100)
    budget.charge("a", 80)
    assert budget.make_room(90, "a") == []


def test_memory_config_is_checked() -> None:
    assert memory_config(None, "s.toml").budget_bytes == 0
    with pytest.raises(ConfigError, match=r"s.toml: \[memory\]"):
        memory_config({"budget": 1}, "s.toml")


# -- warm-up -----------------------------------------------------------------------------------
class CountingPlan:
    backends = ("cpu",)

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.shapes.append(feeds["x"].shape)
        return {"y": feeds["x"]}


def test_warm_up_runs_every_plan_on_every_configured_shape() -> None:
    specs = [TensorSpec("x", "float32", ("batch", 3, "h"))]
    plans = {"cpu": CountingPlan(), "gpu": CountingPlan()}
    config = warmup_config({"runs": 2, "shapes": [{"x": [1, 3, 8]}, {"x": [2, 3, 16]}]}, "m")
    report = warm_up(plans, specs, config)
    for plan in plans.values():
        assert plan.shapes == [(1, 3, 8), (1, 3, 8), (2, 3, 16), (2, 3, 16)]
    assert set(report.first_run_ms) == {"cpu", "gpu"} and all(len(v) == 2 for v in report.first_run_ms.values())
    assert report.done
    # Without [warmup] shapes, a dynamic dim besides dim 0 is never bound to an arbitrary size:
    # warm-up waits for the first request's shapes; static dims are used as they are (dim 0 = 1 row).
    default = CountingPlan()
    report = warm_up({"cpu": default}, specs, WarmupConfig())
    assert default.shapes == [] and report.deferred and not report.done
    static = CountingPlan()
    report = warm_up({"cpu": static}, [TensorSpec("x", "float32", ("batch", 3, 8))], WarmupConfig())
    assert static.shapes == [(1, 3, 8)] and not report.deferred
    one_set = warmup_config({"shapes": {"x": [1, 3, 48]}}, "m")  # a single table is one shape set
    assert one_set.shapes == ({"x": (1, 3, 48)},)
    assert not warm_up({"cpu": CountingPlan()}, specs, WarmupConfig(enabled=False)).done


class FailingPlan:
    backends = ("cpu",)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise ValueError("token id out of range")


def test_a_plan_failing_its_warm_up_is_reported_not_fatal() -> None:
    specs = [TensorSpec("x", "float32", (1, 3)), TensorSpec("s", "object", (2,))]
    good = CountingPlan()
    report = warm_up({"cpu": good, "gpu": FailingPlan()}, specs, WarmupConfig())
    assert set(report.first_run_ms) == {"cpu"} and report.errors == {"gpu": "ValueError: token id out of range"}
    assert good.shapes == [(1, 3)]


def test_warm_up_shapes_that_do_not_fit_are_clear_errors() -> None:
    specs = [TensorSpec("x", "float32", ("batch", 3))]
    with pytest.raises(InvalidInputError, match=r"input 'x' expects \['batch', 3\], got \[1, 4\]"):
        warm_up({"cpu": CountingPlan()}, specs, warmup_config({"shapes": [{"x": [1, 4]}]}, "m"))
    with pytest.raises(InvalidInputError, match="unknown input"):
        warm_up({"cpu": CountingPlan()}, specs, warmup_config({"shapes": [{"z": [1, 3]}]}, "m"))
    with pytest.raises(ConfigError, match="positive integers"):
        warmup_config({"shapes": [{"x": [1, -3]}]}, "m")


# -- shape buckets -----------------------------------------------------------------------------
def _max_pool_model() -> "onnx.ModelProto":
    """Relu then GlobalMaxPool: zero padding cannot change the answer (the maxima are >= 0)."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("GlobalMaxPool", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "maxpool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 1, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_buckets_pad_up_to_the_next_size_and_a_tolerant_model_answers_the_same() -> None:
    import onnxruntime as ort

    from backends.onnx_graph import graph_inputs
    from edge_runtime.shape_buckets import shape_buckets_config

    model = _max_pool_model()
    specs = graph_inputs(model)
    buckets = shape_buckets_config({"pad": True, "dims": [{"input": "x", "axis": 3, "sizes": [32, 8, 16]}]}, specs, "m")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for width, bucket in ((5, 8), (8, 8), (9, 16), (17, 32), (40, 40)):
        x = rng.standard_normal((1, 2, 4, width)).astype(np.float32)
        padded = buckets.apply({"x": x})["x"]
        assert padded.shape == (1, 2, 4, bucket)
        np.testing.assert_array_equal(padded[..., :width], x)
        np.testing.assert_array_equal(session.run(None, {"x": padded})[0], session.run(None, {"x": x})[0])
    assert [s["x"] for s in buckets.warmup_shapes(specs)] == [(1, 2, 4, 8), (1, 2, 4, 16), (1, 2, 4, 32)]
    exact = shape_buckets_config({"dims": [{"input": "x", "axis": 3, "sizes": [8]}]}, specs, "m")
    assert exact.apply({"x": np.zeros((1, 2, 4, 5), np.float32)})["x"].shape == (1, 2, 4, 5)  # no pad: exact


def test_bucket_config_mistakes_are_named() -> None:
    from backends.onnx_graph import graph_inputs
    from edge_runtime.shape_buckets import shape_buckets_config

    specs = graph_inputs(_max_pool_model())
    with pytest.raises(ConfigError, match="not an input"):
        shape_buckets_config({"dims": [{"input": "z", "axis": 3, "sizes": [8]}]}, specs, "m")
    with pytest.raises(ConfigError, match="must be a dynamic dim"):
        shape_buckets_config({"dims": [{"input": "x", "axis": 2, "sizes": [8]}]}, specs, "m")
    with pytest.raises(ConfigError, match="positive integers"):
        shape_buckets_config({"dims": [{"input": "x", "axis": 3, "sizes": []}]}, specs, "m")
