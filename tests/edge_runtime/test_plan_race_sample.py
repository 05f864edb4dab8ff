"""``auto``'s race runs on the caller's sample values, in this process and in a race child.

The model reshapes its input to the shape an integer input gives (``allowzero``): with seeded
feeds that shape is all zeros and the host itself refuses to run it, so the race only has a
verdict when the sample's values reached it — across the child's process boundary too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edge_runtime.config import RuntimeConfig
from edge_runtime.runtime import Runtime


def _reshape_model(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"], allowzero=1), helper.make_node("Relu", ["r"], ["y"])],
        "reshape_by_input", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                             helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("where", ["in-process", "child"])
def test_the_race_runs_on_the_sample_values(where: str, tmp_path: Path) -> None:
    from backends.onnx_graph import load_onnx
    from edge_runtime import plan_choice
    from edge_runtime.plan_race import race_in_process

    path = _reshape_model(tmp_path / "model.onnx")
    runtime = Runtime(RuntimeConfig(cache_dir=tmp_path / "cache"))
    try:
        options, shapes = runtime.compile_options(), {"x": (2, 6), "shape": (2,)}
        sample = {"shape": np.array([3, 4], np.int64)}

        def race(given):
            if where == "child":
                return plan_choice._race_in_child(runtime, path, options, shapes, given)
            return race_in_process(runtime, load_onnx(path), options, shapes, sample=given)

        decision = race(sample)
        assert decision.winner == "cpu" and decision.entry("cpu").measured_ms is not None
        assert decision.where == where
        with pytest.raises(Exception, match="no race shape runs on the host"):
            race(None)  # seeded: a [0, 0] target for 12 values
    finally:
        runtime.close()
