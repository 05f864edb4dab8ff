"""A daemon-wide memory budget: what each loaded model holds, who is busy, whom to unload first.

Server-wide, in ``serve --config``::

    [memory]
    budget_bytes = 1073741824   # 0 (default): no budget
    lazy_load = true            # load a model on its first request, not at start
    footprint_factor = 2.0      # a model's charge: its file size times this

A model's charge is its file size times ``footprint_factor``: the weights
the engine holds plus its working memory (ONNX Runtime keeps the graph and
an arena; OpenCL a device copy). The charge is an estimate fixed at load —
the resident-set growth measured at load is reported beside it
(``measured_bytes``) but not used to decide, since other loads and requests
move the RSS at the same time. A generative model's charge adds its
preallocated generation KV cache and its prefix cache's cap
(``edge_runtime.generation.footprint``), all under the model's name, so
unloading it frees them together; ``parts`` keeps the breakdown
(``weights``, ``kv_cache``, ``prefix_cache``).

``make_room`` picks idle owners, least recently used first, whose release
lets a new charge fit; an owner with requests in flight is never picked.
When even that is not enough it raises QueueFullError (the server answers
429/503 with Retry-After: busy models finish, and room appears).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from edge_runtime.config import from_table
from edge_runtime.errors import ConfigError, QueueFullError


@dataclass(frozen=True)
class MemoryConfig:
    budget_bytes: int = 0
    lazy_load: bool = False
    footprint_factor: float = 2.0

    def __post_init__(self) -> None:
        if self.budget_bytes < 0 or self.footprint_factor <= 0:
            raise ConfigError(f"[memory] budget_bytes must be >= 0 and footprint_factor > 0; "
                              f"got {self.budget_bytes}, {self.footprint_factor}")


def memory_config(table: Mapping[str, Any] | None, where: str) -> MemoryConfig:
    return from_table(MemoryConfig, table, "memory", where)


@dataclass
class _Charge:
    nbytes: int
    measured_bytes: int = 0
    in_flight: int = 0
    last_used: float = 0.0
    parts: Mapping[str, int] = field(default_factory=dict)


class MemoryBudget:
    """Charges per owner (a model name), in-flight counts and recency; thread-safe."""

    def __init__(self, budget_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_bytes = budget_bytes
        self._clock = clock
        self._charges: dict[str, _Charge] = {}
        self._lock = threading.Lock()
        self.unloads = 0  # owners released to make room

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(c.nbytes for c in self._charges.values())

    def charge(self, owner: str, nbytes: int, measured_bytes: int = 0, parts: Mapping[str, int] | None = None) -> None:
        """Record ``owner``'s charge (replacing an earlier one); ``parts``: what it is made of."""
        with self._lock:
            old = self._charges.get(owner)
            self._charges[owner] = _Charge(nbytes, measured_bytes, old.in_flight if old else 0, self._clock(),
                                           dict(parts or {}))

    def release(self, owner: str) -> None:
        with self._lock:
            charge = self._charges.pop(owner, None)
            if charge is not None and charge.in_flight:  # its requests still finish: keep counting them
                self._charges[owner] = _Charge(0, 0, charge.in_flight, charge.last_used)

    def is_busy(self, owner: str) -> bool:
        with self._lock:
            charge = self._charges.get(owner)
            return charge is not None and charge.in_flight > 0

    @contextmanager
    def using(self, owner: str) -> Iterator[None]:
        """Mark ``owner`` busy for the block (a request in flight) and most recently used."""
        done = self.hold(owner)
        try:
            yield
        finally:
            done()

    def hold(self, owner: str) -> Callable[[], None]:
        """Mark ``owner`` busy until the returned callable is called (idempotent): ``using`` for
        work that outlives one block (a stream handed to an HTTP response or a task)."""
        with self._lock:
            charge = self._charges.setdefault(owner, _Charge(0))
            charge.in_flight += 1
            charge.last_used = self._clock()
        released = threading.Event()

        def done() -> None:
            with self._lock:
                if released.is_set():
                    return
                released.set()
                charge = self._charges.get(owner)
                if charge is not None:
                    charge.in_flight -= 1
                    charge.last_used = self._clock()

        return done

    def make_room(self, nbytes: int, for_owner: str) -> list[str]:
        """Idle owners to release, least recently used first, so that ``nbytes`` more fit.

        The caller releases them (unloads the models). ``for_owner``'s own
        charge counts as freed (a reload replaces it). Raises QueueFullError
        when busy owners hold too much, or when ``nbytes`` exceeds the whole
        budget (the message says which).
        """
        if not self.budget_bytes:
            return []
        with self._lock:
            if nbytes > self.budget_bytes:
                raise QueueFullError(f"memory budget: {for_owner!r} needs {nbytes} bytes, more than the whole "
                                     f"budget of {self.budget_bytes} bytes ([memory] budget_bytes)")
            others = {o: c for o, c in self._charges.items() if o != for_owner}
            used = sum(c.nbytes for c in others.values())
            victims = []
            for owner, charge in sorted(others.items(), key=lambda kv: kv[1].last_used):
                if used + nbytes <= self.budget_bytes:
                    break
                if charge.in_flight > 0 or charge.nbytes == 0:
                    continue
                victims.append(owner)
                used -= charge.nbytes
            if used + nbytes > self.budget_bytes:
                busy = sorted(o for o, c in others.items() if c.in_flight > 0)
                raise QueueFullError(f"memory budget: {for_owner!r} needs {nbytes} bytes; "
                                     f"{used} of {self.budget_bytes} stay in use by busy models {busy}; retry later")
            self.unloads += len(victims)
            return victims

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"budget_bytes": self.budget_bytes, "used_bytes": sum(c.nbytes for c in self._charges.values()),
                    "unloads": self.unloads,
                    "owners": {o: {"bytes": c.nbytes, "measured_bytes": c.measured_bytes, "in_flight": c.in_flight,
                                   "parts": dict(c.parts)}
                               for o, c in self._charges.items()}}

    def owner_bytes(self, owner: str) -> tuple[int, int]:
        """(charged, measured) bytes of ``owner``; zeros when it holds nothing."""
        with self._lock:
            charge = self._charges.get(owner)
            return (charge.nbytes, charge.measured_bytes) if charge else (0, 0)

    def owner_parts(self, owner: str) -> dict[str, int]:
        """What ``owner``'s charge is made of (``weights``, ``kv_cache``, ``prefix_cache``); empty when none."""
        with self._lock:
            charge = self._charges.get(owner)
            return dict(charge.parts) if charge else {}
