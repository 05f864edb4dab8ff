"""Dynamic batching: which requests may share a run, how rows are joined and split back.

A model batches when the first dimension of every input and every output is
dynamic and the load-time experiment finds its rows independent (``batch_probe.py``). Requests are *compatible* when their
inputs have the same dtypes and the same non-batch dimensions, and each
request's inputs agree on their row count. Compatible requests are joined
along dim 0; each output is cut back into exactly the rows of each request,
and every request gets its own copy (never a view into another's data).

``BatchSizer`` decides when a batch is ready and how many requests it takes:

* ready at once when the model has no run in flight (an idle device gains
  nothing by waiting; at concurrency 1 a request never waits for company), and
  when a device worker's run just ended (it takes what gathered meanwhile);
* otherwise ready when the waiting rows reach the current limit or the largest
  preferred size under it, or ``max_queue_delay_us`` after the oldest request
  arrived, taking what is there;
* also ready when the waiting rows reach the *knee* of the measured cost curve
  (``cost_curve.py``: the smallest batch size whose per-row cost is within 10 % of
  the best measured): past it a batch saves little, so it stops waiting for company;
* it takes the longest run of requests (in priority order) whose rows sum to a
  preferred size, else the longest that fits the limit (a request larger than
  the limit runs alone); the limit is lowered to the curve's ``cap`` where larger
  batches were measured dearer per row. A deep queue is drained in batches of the
  limit, one after the other, by the device worker that just finished a run;
* adaptive sizing (only with ``latency_target_ms`` > 0) is AIMD on the limit:
  a run whose compute time exceeds the target halves the limit
  (multiplicative decrease), a full batch under the target raises it by one
  row (additive increase), within 1..``max_batch_size``. The target bounds a
  run's compute, the part batch size controls; queueing is bounded separately
  by ``max_queue_delay_us`` and the queue size. Without a target the limit
  stays at ``max_batch_size``: on a CPU, larger batches rarely cost more per
  row, so there is nothing to adapt to.
"""

from __future__ import annotations

from typing import Hashable, Mapping, Sequence

import numpy as np

from edge_runtime.errors import BackendError
from edge_runtime.scheduler.config import BatchingConfig
from edge_runtime.scheduler.cost_curve import EXPLORE_EVERY, CostCurve


def request_rows(feeds: Mapping[str, np.ndarray]) -> int | None:
    """The request's row count, or None when its inputs disagree on dim 0 (it then runs alone)."""
    rows = {array.shape[0] if array.ndim else None for array in feeds.values()}
    if len(rows) != 1 or None in rows:
        return None
    return int(next(iter(rows)))


def batch_key(feeds: Mapping[str, np.ndarray]) -> Hashable:
    """Requests with equal keys may be joined: same names, dtypes and non-batch dimensions."""
    return tuple(sorted((name, array.dtype.str, array.shape[1:]) for name, array in feeds.items()))


def join_feeds(requests: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenate compatible requests' inputs along dim 0 (one request passes through)."""
    if len(requests) == 1:
        return dict(requests[0])
    return {name: np.concatenate([feeds[name] for feeds in requests], axis=0) for name in requests[0]}


def split_outputs(outputs: Mapping[str, np.ndarray], rows: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Cut every output into consecutive ``rows``; raises BackendError if an output's dim 0 disagrees."""
    if len(rows) == 1:
        return [dict(outputs)]
    total = sum(rows)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise BackendError(f"batched run: output {name!r} has shape {list(array.shape)}, "
                               f"expected {total} rows (one per input row) to split among {len(rows)} requests")
    bounds = np.cumsum([0, *rows])
    # Copies, not views: a view would keep (and expose) the whole batch through ``.base``.
    return [{name: array[start:end].copy() for name, array in outputs.items()}
            for start, end in zip(bounds[:-1], bounds[1:])]


class BatchSizer:
    """Batch readiness, batch composition and the AIMD limit (see the module docstring).

    ``cost_ms_per_row``: the load-time measurement of the cost curve (rows -> ms per row), if any.
    """

    def __init__(self, config: BatchingConfig, cost_ms_per_row: Mapping[int, float] | None = None) -> None:
        self.max_rows = max(1, config.max_batch_size)
        self.preferred = tuple(sorted(set(config.preferred_batch_sizes)))
        self.latency_target_ms = config.latency_target_ms
        self.limit = self.max_rows
        self.curve = CostCurve(self.max_rows, cost_ms_per_row)
        self._runs = 0

    def _preferred_ceiling(self) -> int | None:
        fitting = [size for size in self.preferred if size <= self.limit]
        return fitting[-1] if fitting else None

    def effective_limit(self) -> int:
        """The AIMD limit, lowered to the cost curve's cap (lifted for one batch in ``EXPLORE_EVERY``)."""
        cap = self.curve.cap()
        if cap is None or self._runs % EXPLORE_EVERY == EXPLORE_EVERY - 1:
            return self.limit
        return max(1, min(self.limit, cap))

    def ready(self, waiting_rows: int) -> bool:
        """Whether ``waiting_rows`` compatible rows make a batch worth sending without waiting longer."""
        ceiling = self._preferred_ceiling()
        knee = self.curve.knee()
        return (waiting_rows >= self.effective_limit() or (ceiling is not None and waiting_rows >= ceiling)
                or (knee is not None and waiting_rows >= knee))

    def take(self, rows: Sequence[int]) -> int:
        """How many of the waiting requests (rows in priority order) the next batch takes (>= 1)."""
        limit = self.effective_limit()
        fitting, total = 0, 0
        preferred_cut = 0
        for count, size in enumerate(rows, start=1):
            if total + size > limit:
                break
            total += size
            fitting = count
            if total in self.preferred:
                preferred_cut = count
        return max(1, preferred_cut or fitting)

    def observe(self, rows: int, compute_ms: float) -> None:
        """Learn from a run of ``rows`` rows: the cost curve, and the AIMD step with a latency target."""
        self._runs += 1
        self.curve.observe(rows, compute_ms)
        if self.latency_target_ms <= 0:
            return
        if compute_ms > self.latency_target_ms:
            self.limit = max(1, self.limit // 2)
        elif rows >= self.limit:
            self.limit = min(self.max_rows, self.limit + 1)
