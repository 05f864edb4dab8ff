"""Cloud plans the scheduler chooses between like any other: ``cloud``, ``split@k`` and ``split``.

Each has ``name``, ``backends``, ``device``, a synchronous ``run(feeds)``
(the scheduler calls it in a worker thread) and ``estimate_ms()``, the
expected latency now, network included (``estimated_ms`` reads the same,
for the cost policy's prior). A failed cloud call raises ``CloudCallError``,
which is a ``BackendError``: the scheduler then re-runs the request on its
cpu plan and says so in the result.

``SplitPlan.execute`` is the richer path the fallback router uses: when the
cloud fails it finishes the tail locally from the head's outputs (no head
re-run) and reports where each part ran.

Every call teaches the shared ``NetworkEstimator`` (RTT, bandwidth) and the
``CloudSpeed`` (how much faster the peer computes than this device), and is
reported to the optional ``on_call`` hook with its outcome: ``"ok"``, or the
``CloudCallError.kind`` of a failure (``"refused"``, ``"timeout"``,
``"breaker_open"``, ...), for the server's call counters.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from backends.base import Executable
from edge_runtime.cloud.choice import CutCost, SplitProfile
from edge_runtime.cloud.client import CloudCall, CloudCallError, CloudClient
from edge_runtime.cloud.network import SMALL_BYTES
from edge_runtime.cloud.split import Cut

log = logging.getLogger(__name__)

CallHook = Callable[[str], None]  # called with each cloud call's outcome: "ok" or the error's kind


class CloudSpeed:
    """EWMA of ``local ms / cloud ms`` for the same work, from calls whose peer reports its compute time.

    ``fixed``: the configured speedup is kept as is (``[cloud] cloud_speedup``), nothing is learned.
    """

    def __init__(self, speedup: float = 1.0, alpha: float = 0.3, *, fixed: bool = False) -> None:
        if speedup <= 0:
            raise ValueError(f"cloud speedup must be > 0, got {speedup}")
        self.speedup = speedup
        self.alpha = alpha
        self.fixed = fixed
        self.samples = 0
        self._lock = threading.Lock()

    def observe(self, local_ms: float, server_ms: float | None) -> None:
        if self.fixed or server_ms is None or server_ms <= 0 or local_ms <= 0:
            return
        with self._lock:
            sample = local_ms / server_ms
            self.speedup = sample if self.samples == 0 else self.speedup + self.alpha * (sample - self.speedup)
            self.samples += 1

    def cloud_ms(self, local_ms: float) -> float:
        return local_ms / self.speedup


def _call(client: CloudClient, model: str, feeds: Mapping[str, np.ndarray], request_id: str | None,
          on_call: CallHook | None) -> CloudCall:
    """``client.infer``, reporting the outcome to ``on_call``."""
    try:
        call = client.infer(model, feeds, request_id=request_id)
    except CloudCallError as exc:
        if on_call is not None:
            on_call(exc.kind)
        raise
    if on_call is not None:
        on_call("ok")
    return call


def _learn(client: CloudClient, speed: CloudSpeed, call: CloudCall, local_equivalent_ms: float) -> None:
    speed.observe(local_equivalent_ms, call.server_ms)
    server_ms = call.server_ms if call.server_ms is not None else speed.cloud_ms(local_equivalent_ms)
    client.network.observe_call(call.elapsed_ms, call.sent_bytes + call.received_bytes, server_ms)


class CloudPlan:
    """The whole model on the peer (``remote_model``)."""

    name = "cloud"
    backends = ("cloud",)
    device = "cloud"

    def __init__(self, client: CloudClient, remote_model: str, *, local_ms: float, io_bytes: int,
                 speed: CloudSpeed | None = None, on_call: CallHook | None = None) -> None:
        self.client = client
        self.remote_model = remote_model
        self.local_ms = local_ms  # this device's time for the whole model: the cloud's work in local units
        self.io_bytes = io_bytes
        self.speed = speed or CloudSpeed()
        self.on_call = on_call

    def call(self, feeds: Mapping[str, np.ndarray], request_id: str | None = None) -> CloudCall:
        call = _call(self.client, self.remote_model, feeds, request_id, self.on_call)
        _learn(self.client, self.speed, call, self.local_ms)
        return call

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.call(feeds).outputs

    def estimate_ms(self) -> float:
        return self.client.network.snapshot().call_ms(self.io_bytes, self.speed.cloud_ms(self.local_ms))

    @property
    def estimated_ms(self) -> float:
        return self.estimate_ms()


@dataclass(frozen=True)
class SplitRun:
    """A split run: outputs, where the tail ran, and the facts of the cloud call."""

    outputs: dict[str, np.ndarray]
    plan: str
    tail_ran_on: str  # "cloud" or "local"
    call: CloudCall | None
    error: CloudCallError | None  # why the tail ran locally

    @property
    def ran_twice(self) -> bool:
        """The tail may have run in the cloud *and* locally (the cloud's answer was lost after sending)."""
        return self.error is not None and self.error.maybe_ran


class SplitPlan:
    """Head on this device, tail for cut ``cut`` on the peer (``remote_model``).

    ``tail_local`` (optional) lets ``execute`` finish locally when the cloud fails.
    ``device`` is ``cpu``: the head is CPU work, and the worker slot is held while
    the tail's call is in flight.
    """

    backends = ("cpu", "cloud")
    device = "cpu"

    def __init__(self, cost: CutCost, head: Executable, client: CloudClient, remote_model: str, *,
                 local_total_ms: float, speed: CloudSpeed | None = None,
                 tail_local: Executable | None = None, on_call: CallHook | None = None) -> None:
        self.cost = cost
        self.cut: Cut = cost.cut
        self.name = self.cut.name
        self.head = head
        self.tail_local = tail_local
        self.client = client
        self.remote_model = remote_model
        self.local_total_ms = local_total_ms
        self.speed = speed or CloudSpeed()
        self.on_call = on_call

    @property
    def tail_local_ms(self) -> float:
        return max(0.0, self.local_total_ms - self.cost.head_ms)

    def _head(self, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(what crosses the cut, graph outputs the head already finished)."""
        produced = self.head.run({name: feeds[name] for name in self.cut.head_inputs})
        crossing = {name: (feeds[name] if name in self.cut.passthrough else produced[name])
                    for name in self.cut.tensors}
        finished = {name: produced[name] for name in self.cut.head_outputs
                    if name not in crossing and name in produced}
        return crossing, finished

    def execute(self, feeds: Mapping[str, np.ndarray], *, finish_locally: bool = True,
                request_id: str | None = None) -> SplitRun:
        """Run head then tail; on a cloud failure finish the tail here when possible, else raise it."""
        crossing, finished = self._head(feeds)
        try:
            call = _call(self.client, self.remote_model, crossing, request_id, self.on_call)
        except CloudCallError as exc:
            if not finish_locally or self.tail_local is None:
                raise
            log.warning("%s: cloud tail failed (%s); finishing the tail locally", self.name, exc)
            return SplitRun({**finished, **self.tail_local.run(crossing)}, self.name, "local", None, exc)
        _learn(self.client, self.speed, call, self.tail_local_ms)
        return SplitRun({**finished, **call.outputs}, self.name, "cloud", call, None)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.execute(feeds, finish_locally=False).outputs

    def estimate_ms(self) -> float:
        net = self.client.network.snapshot()
        return self.cost.head_ms + net.call_ms(self.cost.call_bytes, self.speed.cloud_ms(self.tail_local_ms))

    @property
    def estimated_ms(self) -> float:
        return self.estimate_ms()


class AutoSplitPlan:
    """``split``: runs whichever ``split@k`` is cheapest under the network as last measured.

    Estimates go stale when the chosen plan stops teaching them, so:
    the RTT estimate is refreshed with a health probe when it is older than
    ``probe_interval_s`` (large calls teach bandwidth, not RTT), and when no
    call has moved enough bytes to measure bandwidth for ``bandwidth_stale_s``
    (the choice moves few bytes, as on a poor link), the next request takes
    the cheapest plan that does (``explored`` counts these).
    """

    name = "split"
    backends = ("cpu", "cloud")
    device = "cpu"

    def __init__(self, plans: Mapping[str, SplitPlan], profile: SplitProfile, client: CloudClient,
                 speed: CloudSpeed, probe_interval_s: float = 2.0, bandwidth_stale_s: float = 5.0) -> None:
        if not plans:
            raise ValueError("AutoSplitPlan needs at least one split@k plan")
        self.plans = dict(plans)
        self.profile = profile
        self.client = client
        self.speed = speed
        self.probe_interval_s = probe_interval_s
        self.bandwidth_stale_s = bandwidth_stale_s
        self.last_choice: str | None = None
        self.explored = 0

    def choose(self) -> SplitPlan:
        network = self.client.network
        now = time.monotonic()
        if network.last_rtt_sample_s is None or now - network.last_rtt_sample_s > self.probe_interval_s:
            self.client.ready()
        snapshot = network.snapshot()
        best = self.profile.best(snapshot, self.speed.speedup, allowed=list(self.plans))
        last_bandwidth_s = network.last_bandwidth_sample_s
        stale = last_bandwidth_s is None or now - last_bandwidth_s > self.bandwidth_stale_s
        if stale and best.call_bytes <= SMALL_BYTES:
            teaching = [name for name, plan in self.plans.items() if plan.cost.call_bytes > SMALL_BYTES]
            if teaching:
                self.explored += 1
                explore = self.profile.best(snapshot, self.speed.speedup, allowed=teaching)
                log.info("split: exploring %s to re-measure bandwidth (best is %s)", explore.plan, best.plan)
                return self.plans[explore.plan]
        if best.plan != self.last_choice:
            log.info("split: now %s (estimated %.2f ms)", best.plan, best.estimated_ms)
        self.last_choice = best.plan
        return self.plans[best.plan]

    def execute(self, feeds: Mapping[str, np.ndarray], **kwargs: Any) -> SplitRun:
        return self.choose().execute(feeds, **kwargs)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.choose().run(feeds)

    def estimate_ms(self) -> float:
        return min(plan.estimate_ms() for plan in self.plans.values())

    @property
    def estimated_ms(self) -> float:
        return self.estimate_ms()
