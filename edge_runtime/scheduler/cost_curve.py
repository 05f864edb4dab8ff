"""The measured cost of a run per row, at each batch size: what a batch of n rows saves.

A CPU model's per-row cost falls with the batch size and then flattens (the PP-OCR
classifier on 2 spinning threads: 1.10 / 0.65 / 0.54 / 0.57 ms per row at 1 / 4 / 8 /
16 rows): most of the gain is had by some size, the *knee*, and waiting for more rows
than that only adds latency. ``CostCurve`` keeps an EWMA of ms per row for each batch
size it has seen (seeded at load by ``batch_probe.measure_cost_curve`` where the served
shape is known, then fed by every finished run) and answers:

* ``knee()`` — the smallest measured size whose per-row cost is within ``KNEE_MARGIN``
  of the best measured one (None before two sizes are known);
* ``cap()`` — the largest size worth taking: the best measured size when every measured
  size above it costs more per row by more than ``CAP_MARGIN`` (a model whose larger
  batches fall out of cache), else no cap. The sizer lifts the cap for one batch in
  every ``EXPLORE_EVERY`` so a size measured on a bad moment is measured again.

A size counts once it is *known*: measured at load (best of a few quiet runs), or seen
in ``MIN_RUNS`` live runs. One run on a busy host can cost twice another, and a cap
drawn from it would stop batching for no reason.

Until sizes are measured nothing changes: the sizer behaves as without a curve.
"""

from __future__ import annotations

from typing import Mapping

KNEE_MARGIN = 0.10  # per-row cost within 10 % of the best counts as "most of the gain"
CAP_MARGIN = 0.25  # larger batches must cost 25 % more per row before the sizer stops taking them
MIN_RUNS = 5  # live runs of a size before it counts (a load-time measurement counts at once)
EXPLORE_EVERY = 50  # runs between two batches that ignore the cap (BatchSizer)
BATCH_REACH = 8  # rows of the largest batch that must be known before batches are judged by their best row
ALPHA = 0.2  # EWMA weight of a new run (runs under load vary; the curve should not jump)


class CostCurve:
    """EWMA ms per row by batch size (see the module docstring). Not thread-safe: the caller locks."""

    def __init__(self, max_rows: int, seed: Mapping[int, float] | None = None) -> None:
        self.max_rows = max(1, int(max_rows))
        self._per_row: dict[int, float] = {}
        self._runs: dict[int, int] = {}
        for rows, ms in (seed or {}).items():
            self.observe(rows, ms * rows)
            if rows in self._runs:
                self._runs[rows] = max(self._runs[rows], MIN_RUNS)  # measured at load: known at once

    def observe(self, rows: int, compute_ms: float) -> None:
        """A run of ``rows`` rows took ``compute_ms``; sizes outside 1..max_rows and bad times are ignored."""
        if not 1 <= rows <= self.max_rows or not compute_ms > 0:
            return
        sample = compute_ms / rows
        previous = self._per_row.get(rows)
        self._per_row[rows] = sample if previous is None else previous + ALPHA * (sample - previous)
        self._runs[rows] = self._runs.get(rows, 0) + 1

    def per_row_ms(self) -> dict[int, float]:
        return {rows: round(ms, 4) for rows, ms in sorted(self._per_row.items())}

    def per_row_ms_at(self, rows: int) -> float | None:
        """The EWMA ms per row of runs of ``rows`` rows (None: none seen or seeded)."""
        return self._per_row.get(rows)

    def _known(self) -> dict[int, float]:
        return {rows: ms for rows, ms in self._per_row.items() if self._runs.get(rows, 0) >= MIN_RUNS}

    def knee(self) -> int | None:
        """The smallest known size within ``KNEE_MARGIN`` of the best per-row cost (None: too few sizes)."""
        known = self._known()
        if len(known) < 2:
            return None
        best = min(known.values())
        return min(rows for rows, ms in known.items() if ms <= best * (1.0 + KNEE_MARGIN))

    def batch_row_ms(self) -> float | None:
        """What batches cost a row at their best: the lowest per-row cost of the known sizes of two rows or
        more, once one of at least ``min(max_rows, BATCH_REACH)`` rows is known (None before: small
        batches alone do not say what larger ones save)."""
        known = {rows: ms for rows, ms in self._known().items() if rows >= 2}
        if not known or max(known) < min(self.max_rows, BATCH_REACH):
            return None
        return min(known.values())

    def cap(self) -> int | None:
        """The largest size worth taking, when the known sizes above the best cost clearly more per row."""
        known = self._known()
        if len(known) < 2:
            return None
        best_rows = min(known, key=known.__getitem__)
        above = [ms for rows, ms in known.items() if rows > best_rows]
        if above and min(above) > known[best_rows] * (1.0 + CAP_MARGIN):
            return best_rows
        return None
