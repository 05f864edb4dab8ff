"""Plans: named ways of running one model, which the scheduler chooses between.

A plan takes validated feeds and returns outputs. ``backends`` says where it
runs (for results and metrics). The partitioner adds multi-stage plans; a
loaded ``Model`` gives the single-backend plan it was compiled for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

import numpy as np


class Plan(Protocol):
    name: str
    backends: tuple[str, ...]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        ...


@dataclass(frozen=True)
class CallablePlan:
    """A plan backed by any ``feeds -> outputs`` callable (an executable's ``run``)."""

    name: str
    backends: tuple[str, ...]
    call: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.call(feeds)
