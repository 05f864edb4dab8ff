"""``auto`` on the default configuration, real calibration, PoCL and ONNX Runtime: over a zoo of
models, the plan it loads runs within 1.1x of the best fixed plan, measured interleaved.

This checks the *choice* (a wrong pick is 1.5-3x off here), not a speed: both
sides run on the same machine in the same rounds, the figure is the median of
per-round bests, and a miss is measured again (up to three runs of rounds) before it fails.
When the fastest fixed plan has the stages auto chose, only a gap of 1.5x fails (a CI run
once read 0.132 against 0.114 ms three times over for the same CPU plan).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.requires_opencl

ROUNDS = 15
MARGIN = 1.1
SAME_PLAN_MARGIN = 1.5  # auto's plan against a fixed load of the same stages: only noise (or a slow auto load)


def ocr_style_cnn(seed: int = 4) -> onnx.ModelProto:
    """A CRNN-like recogniser: conv/relu/max-pool stages on a [1, 3, 32, W] strip, width pooled last."""
    rng = np.random.default_rng(seed)
    nodes, inits, x, c_in = [], [], "x", 3
    for i, c_out in enumerate((16, 32, 64)):
        w = (rng.standard_normal((c_out, c_in, 3, 3)) * np.sqrt(2 / (9 * c_in))).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
                  helper.make_node("MaxPool", [f"r{i}"], [f"p{i}"], kernel_shape=[2, 2], strides=[2, 2])]
        x, c_in = f"p{i}", c_out
    inits.append(numpy_helper.from_array((rng.standard_normal((40, 64, 4, 1)) * 0.05).astype(np.float32), "head"))
    nodes += [helper.make_node("Conv", [x, "head"], ["logits"]),  # 4 rows -> 1: a column per step
              helper.make_node("Softmax", ["logits"], ["probs"], axis=1)]
    graph = helper.make_graph(nodes, "ocr_style", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, "W"])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _zoo() -> dict[str, Callable[[], onnx.ModelProto]]:
    from edge_runtime import model_zoo

    return {"mobilenet": model_zoo.build_mobilenet,
            "resnet": lambda: model_zoo.build_resnet(image_size=56, width=32),
            "ocr_cnn": ocr_style_cnn,
            "transformer": model_zoo.build_transformer,
            "mlp": model_zoo.build_mlp}


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory, opencl_backend: Any) -> Any:
    """The default configuration: no backend pinned, a fresh cache, calibration measured here."""
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    rt = Runtime(RuntimeConfig(cache_dir=tmp_path_factory.mktemp("cache")))
    assert rt.accelerator() == "opencl", "the zoo compares PoCL with ONNX Runtime"
    yield rt
    rt.close()


@pytest.mark.parametrize("name", sorted(_zoo()))
def test_auto_is_within_a_tenth_of_the_best_fixed_plan(runtime: Any, tmp_path: Path, name: str) -> None:
    from edge_runtime.engine_choice import race_runners, seeded_feeds

    proto = _zoo()[name]()
    path = tmp_path / f"{name}.onnx"
    onnx.save(proto, str(path))
    # Sessions that do not spin (as served): a spinning ORT pool would slow whichever side runs next.
    options = dataclasses.replace(runtime.compile_options(), allow_spinning=False)
    auto = runtime.load(path, options=options)
    decision = auto.report.decision
    assert decision is not None and decision.entry("cpu").measured_ms is not None, "auto measured its choice"
    feeds = seeded_feeds(proto, decision.shapes)
    fixed = {plan: runtime.load(path, plan=plan, input_shapes=decision.shapes, options=options)
             for plan in ("cpu", "gpu", "hybrid")}
    want = fixed["cpu"].run(feeds)
    for model in (auto, *fixed.values()):
        for key, value in model.run(feeds).items():
            np.testing.assert_allclose(value, want[key], rtol=1e-3, atol=1e-4)
    runners = {"auto": lambda: auto.run(feeds), **{p: (lambda m=m: m.run(feeds)) for p, m in fixed.items()}}
    # A miss is measured again (twice): on a shared 2-core box two instances of one plan differ by up to
    # 20% in a run of rounds; a wrong choice is off by 1.5-3x in every run. Where the fastest fixed plan
    # runs the stages auto chose (same backends), the gap is between two instances of one plan: it is
    # held to SAME_PLAN_MARGIN, which still catches an auto load slower than its own plan.
    for attempt in range(3):
        p50 = race_runners(runners, budget_s=1e9, rounds=ROUNDS, runs_per_round=3)  # rotating interleaved rounds
        fastest = min((k for k in p50 if k != "auto"), key=p50.__getitem__)
        best = p50[fastest]
        same = decision.entry(fastest) is not None and \
            decision.entry(fastest).backends == decision.entry(decision.winner).backends
        margin = SAME_PLAN_MARGIN if same else MARGIN
        if p50["auto"] <= margin * best:
            break
    assert p50["auto"] <= margin * best, (f"{name}: auto ({decision.winner}) p50 {p50['auto']:.3f} ms vs best fixed "
                                          f"{fastest} {best:.3f} ms: {p50}; race: {decision.to_dict()['candidates']}")
    for model in (auto, *fixed.values()):
        model.close()
