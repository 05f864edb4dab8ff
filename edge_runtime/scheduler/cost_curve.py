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
  size above it costs more per row by more than the margin (a model whose larger
  batches fall out of cache), else no cap. The sizer lifts the cap for one batch in
  every ``EXPLORE_EVERY`` so a size measured on a bad moment is measured again.

Until sizes are measured nothing changes: the sizer behaves as without a curve.
"""

from __future__ import annotations

from typing import Mapping

KNEE_MARGIN = 0.10  # per-row cost within 10 % of the best counts as "most of the gain"
EXPLORE_EVERY = 50  # runs between two batches that ignore the cap (BatchSizer)
ALPHA = 0.2  # EWMA weight of a new run (runs under load vary; the curve should not jump)


class CostCurve:
    """EWMA ms per row by batch size (see the module docstring). Not thread-safe: the caller locks."""

    def __init__(self, max_rows: int, seed: Mapping[int, float] | None = None) -> None:
        self.max_rows = max(1, int(max_rows))
        self._per_row: dict[int, float] = {}
        for rows, ms in (seed or {}).items():
            self.observe(rows, ms * rows)

    def observe(self, rows: int, compute_ms: float) -> None:
        """A run of ``rows`` rows took ``compute_ms``; sizes outside 1..max_rows and bad times are ignored."""
        if not 1 <= rows <= self.max_rows or not compute_ms > 0:
            return
        sample = compute_ms / rows
        previous = self._per_row.get(rows)
        self._per_row[rows] = sample if previous is None else previous + ALPHA * (sample - previous)

    def per_row_ms(self) -> dict[int, float]:
        return {rows: round(ms, 4) for rows, ms in sorted(self._per_row.items())}

    def knee(self) -> int | None:
        """The smallest measured size within ``KNEE_MARGIN`` of the best per-row cost (None: too few sizes)."""
        if len(self._per_row) < 2:
            return None
        best = min(self._per_row.values())
        return min(rows for rows, ms in self._per_row.items() if ms <= best * (1.0 + KNEE_MARGIN))

    def cap(self) -> int | None:
        """The largest size worth taking, when the measured sizes above the best cost clearly more per row."""
        if len(self._per_row) < 2:
            return None
        best_rows = min(self._per_row, key=self._per_row.__getitem__)
        above = [ms for rows, ms in self._per_row.items() if rows > best_rows]
        if above and min(above) > self._per_row[best_rows] * (1.0 + KNEE_MARGIN):
            return best_rows
        return None
