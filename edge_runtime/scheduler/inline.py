"""When an idle model's request runs on the event loop itself (``[scheduler] inline_max_ms``).

A request handed to a device worker pays two thread hand-offs: the worker's wake-up, and the
loop's wake-up through its self-pipe when the answer comes back. On the PP-OCR classifier (a
1 ms run, 2 cores) that is ~0.2 ms of the daemon's ~0.8 ms over in-process ONNX Runtime at
c=1 (``tools/bench_c1_floor.py``: a bare aiohttp server running the model in an executor
thread against the same server answering canned bytes, plus ORT alone). The loop has nothing
else to do while an idle model runs one short request, so it runs it itself: ORT releases the
GIL and its pool threads work as they would under a worker.

The loop is blocked for that run, so only when all of these hold:

* the run is short: the model's measured one-row compute (the batcher's cost curve, learnt from
  runs on the workers; nothing is inlined before one) is at most ``inline_max_ms`` (default
  2 ms; 0 turns inlining off);
* the model is idle: nothing else of it queued or in flight, the request is one batch on its
  own, and every slot of the device is free (no other model is running there);
* the loop has nothing else ready to run: no callback or task waiting in its ready queue. In a
  burst, requests read from their sockets in one poll become handler tasks that run one after
  another in one turn of the loop; while the first is decided the others wait in that queue, so
  only a request that is alone on the loop runs there, and the rest go to the worker and batch
  as before (without this check each would find the model idle again after the previous one's
  run and run on the loop in turn, never batching). asyncio's ready queue is private
  (``BaseEventLoop._ready``, a deque since Python 3.4); a loop without it (uvloop) never
  inlines;
* requests do not stream in: the gap since the previous arrival is at least half that one-row
  cost. One client at a time leaves a whole request's latency (a run plus the transport) between
  two arrivals; many clients at once leave a fraction of a run, and a worker that parses nothing
  serves such a stream better than the loop, which must also read the next requests. (Half, not
  all of it: the cost is an average, and a run on the loop must not miss its own next request.)

Only the ``cpu`` device is inlined (a GPU run's wait is the device's, and a cloud call's the
network's: neither belongs on the loop).
"""

from __future__ import annotations

from typing import Any

INLINE_MAX_MS = 2.0  # a run this short blocks the loop no longer than a busy loop's own turn
MAX_INLINE_MAX_MS = 50.0  # beyond this a blocked loop drops health checks and other models' answers


class InlineGate:
    """Decides whether a request may run on the loop (see the module docstring). The caller locks."""

    def __init__(self, max_ms: float) -> None:
        self.max_ms = float(max_ms)
        self._previous_arrival: float | None = None
        self._gap_ms = 0.0  # between the latest arrival and the one before it

    def arrived(self, now: float) -> None:
        """A request arrived at ``now`` (``time.monotonic()``)."""
        if self._previous_arrival is not None:
            self._gap_ms = (now - self._previous_arrival) * 1e3
        self._previous_arrival = now

    def allows(self, one_row_ms: float | None, *, idle: bool, loop: Any) -> bool:
        """Whether the request that just arrived runs on ``loop``; ``one_row_ms``: its measured cost
        (None: not measured yet); ``idle``: the model and its device have nothing else to do."""
        if self.max_ms <= 0 or not idle or one_row_ms is None or self._previous_arrival is None:
            return False
        if one_row_ms > self.max_ms or self._gap_ms < 0.5 * one_row_ms:
            return False
        ready = getattr(loop, "_ready", None)
        return ready is not None and len(ready) == 0
