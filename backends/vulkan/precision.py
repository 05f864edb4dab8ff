"""fp16 on request: the converted model, and its measured drift from the fp32 model on ORT's CPU EP."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

DRIFT_SEED = 0
_DYNAMIC_DIM = 1  # a symbolic dimension is measured at 1 (batch-like); the drift is a sample, not a bound


def to_fp16(proto: "onnx.ModelProto") -> "onnx.ModelProto":
    """The model with float16 weights and arithmetic, float32 at its inputs and outputs."""
    from onnxconverter_common import float16

    return float16.convert_float_to_float16(proto, keep_io_types=True)


def drift_between(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Max |diff| and max relative diff (to the output's largest magnitude) over every output."""
    abs_diff = max((float(np.max(np.abs(got[n].astype(np.float64) - want[n]))) for n in want if want[n].size),
                   default=0.0)
    scale = max((float(np.max(np.abs(want[n]))) for n in want if want[n].size), default=0.0)
    return {"max_abs": abs_diff, "max_rel": abs_diff / scale if scale else 0.0, "reference": "fp32 on the CPU",
            "seed": DRIFT_SEED}


def measure_drift(proto: "onnx.ModelProto", run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
                  ) -> dict[str, Any]:
    """Drift of ``run`` (the fp16 model) from the fp32 model on ORT's CPU EP, on one seeded feed."""
    import onnxruntime as ort

    from backends.onnx_graph import graph_inputs

    rng = np.random.default_rng(DRIFT_SEED)
    feeds = {}
    for spec in graph_inputs(proto):
        if not spec.dtype.startswith("float"):
            return {"measured": False, "why": f"input {spec.name} is {spec.dtype}; only float feeds are sampled"}
        shape = [d if isinstance(d, int) and d > 0 else _DYNAMIC_DIM for d in spec.shape]
        feeds[spec.name] = rng.uniform(-1, 1, shape).astype(spec.dtype)
    try:
        want_session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        want = dict(zip([o.name for o in want_session.get_outputs()], want_session.run(None, feeds)))
        got = run(feeds)
    except Exception as exc:  # a sample that the model rejects (shape too small) means no measurement
        log.info("fp16 drift not measured: %s", exc)
        return {"measured": False, "why": str(exc).splitlines()[0][:200]}
    return {"measured": True, **drift_between(got, want)}
