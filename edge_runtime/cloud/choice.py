"""Choosing where to cut (Neurosurgeon's approach): measured local layers, cloud speed, network.

For every candidate cut ``k`` the head is timed with ONNX Runtime on this
device (``profile_cuts``). With a network snapshot (RTT, bandwidth; see
``network.py``) and the cloud's speed relative to this device
(``cloud_speedup``: local ms / cloud ms for the same work, measured or
configured), the latency of each way to run the model is::

    local        = local_total_ms
    cloud        = rtt + (input + output bytes) / bw + local_total_ms / speedup
    split@k      = head_ms[k] + rtt + (cut bytes + tail output bytes) / bw + (local_total_ms - head_ms[k]) / speedup

``SplitProfile.estimates`` evaluates all of them; the cheapest is the choice.
Re-evaluating with a fresh snapshot re-chooses as the network changes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from edge_runtime.cloud.network import NetworkSnapshot
from edge_runtime.cloud.split import Cut, ModelCutter

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)


def cut_index(plan: str) -> int:
    """``k`` of a ``"split@k"`` plan name; ValueError for any other name."""
    prefix, _, index = plan.partition("@")
    if prefix != "split" or not index.isdigit():
        raise ValueError(f"not a split plan name: {plan!r}")
    return int(index)


@dataclass(frozen=True)
class CutCost:
    """One candidate cut with its measured head latency and the bytes its call moves."""

    cut: Cut
    head_ms: float
    tail_output_bytes: int

    @property
    def call_bytes(self) -> int:
        return (self.cut.nbytes or 0) + self.tail_output_bytes


@dataclass(frozen=True)
class PlanEstimate:
    plan: str  # "local", "cloud" or "split@k"
    estimated_ms: float
    local_ms: float
    network_ms: float
    cloud_ms: float
    call_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan, "estimated_ms": round(self.estimated_ms, 3), "local_ms": round(self.local_ms, 3),
                "network_ms": round(self.network_ms, 3), "cloud_ms": round(self.cloud_ms, 3),
                "call_bytes": self.call_bytes}


@dataclass(frozen=True)
class SplitProfile:
    """What was measured about one model on this device; independent of the network."""

    local_total_ms: float
    input_bytes: int
    output_bytes: int
    cuts: tuple[CutCost, ...]

    def cost_of(self, index: int) -> CutCost | None:
        return next((c for c in self.cuts if c.cut.index == index), None)

    def estimate(self, plan: str, net: NetworkSnapshot, cloud_speedup: float) -> PlanEstimate:
        """The estimate of ``"local"``, ``"cloud"`` or ``"split@k"`` (k one of the profiled cuts)."""
        if plan == "local":
            return PlanEstimate(plan, self.local_total_ms, self.local_total_ms, 0.0, 0.0, 0)
        if plan == "cloud":
            head_ms, call_bytes = 0.0, self.input_bytes + self.output_bytes
        else:
            cost = self.cost_of(cut_index(plan))
            if cost is None:
                raise KeyError(f"{plan} is not a profiled cut; cuts: {[c.cut.name for c in self.cuts]}")
            head_ms, call_bytes = cost.head_ms, cost.call_bytes
        cloud_ms = max(0.0, self.local_total_ms - head_ms) / cloud_speedup
        network_ms = net.call_ms(call_bytes)
        return PlanEstimate(plan, head_ms + network_ms + cloud_ms, head_ms, network_ms, cloud_ms, call_bytes)

    def estimates(self, net: NetworkSnapshot, cloud_speedup: float) -> list[PlanEstimate]:
        """Every plan's estimate: local, cloud, then each cut in graph order."""
        plans = ["local", "cloud", *(c.cut.name for c in self.cuts)]
        return [self.estimate(plan, net, cloud_speedup) for plan in plans]

    def best(self, net: NetworkSnapshot, cloud_speedup: float, *, splits_only: bool = False,
             allowed: Sequence[str] | None = None) -> PlanEstimate:
        """The cheapest plan (ties: the earlier in ``estimates`` order)."""
        options = [e for e in self.estimates(net, cloud_speedup)
                   if (not splits_only or e.plan.startswith("split@")) and (allowed is None or e.plan in allowed)]
        if not options:
            raise ValueError("no plan to choose from")
        return min(options, key=lambda e: e.estimated_ms)


def time_ms(run: Callable[[], Any], repeat: int, warmup: int = 2) -> float:
    """Median wall time of ``run`` over ``repeat`` calls after ``warmup`` untimed ones."""
    from edge_runtime.timing import measure_ms

    return float(np.median(measure_ms(run, repeat, warmup)))


def ort_session(model: "onnx.ModelProto", threads: int | None) -> Any:
    """A plain ONNX Runtime CPU session, as the baseline a user would build."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def profile_cuts(cutter: ModelCutter, cuts: Sequence[Cut], feeds: Mapping[str, np.ndarray], *,
                 repeat: int = 10, threads: int | None = None) -> SplitProfile:
    """Time the whole model and each cut's head with ONNX Runtime on this device.

    A longer head cannot be cheaper than a shorter one, so timings are made
    non-decreasing along the graph (running maximum) and capped at the whole
    model's time: measurement noise must not invent a free layer.
    """
    whole = ort_session(cutter.prepared, threads)
    local_total_ms = time_ms(lambda: whole.run(None, dict(feeds)), repeat)
    costs, floor_ms = [], 0.0
    for cut in sorted(cuts, key=lambda c: c.index):
        head, _ = cutter.extract(cut)
        session = ort_session(head, threads)
        head_feeds = {name: feeds[name] for name in cut.head_inputs}
        measured = time_ms(lambda: session.run(None, head_feeds), repeat)
        floor_ms = min(max(floor_ms, measured), local_total_ms)
        costs.append(CutCost(cut, floor_ms, cutter.output_bytes(cut.tail_outputs)))
        log.debug("%s: head %.3f ms (measured %.3f), %s bytes cross", cut.name, floor_ms, measured, cut.nbytes)
    input_bytes = cutter.output_bytes([spec.name for spec in cutter.inputs])
    output_bytes = cutter.output_bytes(cutter.view.graph_outputs)
    return SplitProfile(local_total_ms, input_bytes, output_bytes, tuple(costs))
