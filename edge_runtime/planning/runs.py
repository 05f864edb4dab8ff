"""What one run of a plan gives back: its outputs and any stage that re-ran on the host.

Apart from ``executor`` so that ``pipeline`` (which the executor drives) can build them without
importing the executor back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class StageNote:
    """A stage that re-ran on the host during one run: the line to report, and its metric labels."""

    text: str
    backend: str
    reason: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class PlanRun:
    """One request's outputs and, if a stage re-ran on the host, a line saying which and why;
    ``labels`` (failed backend, reason) of the first such stage, for bounded metric labels."""

    outputs: dict[str, np.ndarray]
    fallback: str | None = None
    labels: tuple[str, str] | None = None

    @classmethod
    def of(cls, outputs: dict[str, np.ndarray], notes: Sequence[StageNote | str]) -> "PlanRun":
        first = next((n for n in notes if isinstance(n, StageNote)), None)
        return cls(outputs, "; ".join(map(str, notes)) or None,
                   (first.backend, first.reason) if first is not None else None)
