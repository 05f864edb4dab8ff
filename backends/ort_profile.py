"""ONNX Runtime's own profiler over a model: per-node kernel time on the CPU execution provider.

``profile_nodes`` opens a profiling session (``SessionOptions.enable_profiling``),
runs the feeds ``repeats + 1`` times, and reads the trace ORT writes: one
``Node`` event per kernel launch (``<node>_kernel_time``, duration in µs,
``op_name`` and ``provider`` in its args). The first run is dropped (it pays
allocation and first-touch costs), the rest are averaged.
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from backends.errors import BackendError
from backends.onnx_graph import load_onnx

if TYPE_CHECKING:
    import numpy as np

    from backends.base import ModelSource

_SUFFIX = "_kernel_time"


def profile_nodes(model: "ModelSource", feeds: Mapping[str, "np.ndarray"], *, repeats: int = 10,
                  intra_op_threads: int | None = None) -> list[dict[str, Any]]:
    """Rows ``{"node", "op_type", "provider", "mean_us", "calls"}``, one per node that ran, slowest first.

    Raises BackendError when ONNX Runtime cannot load or run the model.
    """
    import onnxruntime as ort

    proto = load_onnx(model)
    with tempfile.TemporaryDirectory(prefix="edge-runtime-prof-") as tmp:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "ort")
        options.inter_op_num_threads = 1
        if intra_op_threads:
            options.intra_op_num_threads = intra_op_threads
        try:
            session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            for _ in range(max(1, repeats) + 1):
                session.run(names, dict(feeds))
            trace = Path(session.end_profiling())
        except Exception as exc:  # ORT raises Fail/InvalidArgument/... with no common base
            raise BackendError(f"cpu: onnxruntime profiling failed: {exc}") from exc
        events = json.loads(trace.read_text())
    return _node_rows(events)


def _node_rows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    durations: dict[str, list[float]] = defaultdict(list)
    meta: dict[str, tuple[str, str]] = {}
    for event in events:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith(_SUFFIX):
            continue
        node = name[: -len(_SUFFIX)]
        durations[node].append(float(event.get("dur", 0)))
        args = event.get("args", {})
        meta[node] = (str(args.get("op_name", "")), str(args.get("provider", "")))
    rows = []
    for node, values in durations.items():
        kept = values[1:] or values  # drop the first (warm-up) run's launch
        rows.append({"node": node, "op_type": meta[node][0], "provider": meta[node][1],
                     "mean_us": round(sum(kept) / len(kept), 2), "calls": len(kept)})
    rows.sort(key=lambda r: r["mean_us"], reverse=True)
    return rows
