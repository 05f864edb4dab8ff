"""Device workers: one bounded pool of run slots per device, shared by every model on it.

Plans whose backends share a device share that device's worker, so two
models never oversubscribe the CPU cores or interleave on one GPU queue,
while the cpu worker and the gpu worker run at the same time.

How CPU cores are split (``cpu_split``): one run at a time with every core as
an intra-op thread up to 4 cores; beyond that, one concurrent run per 4 cores,
each with ``cores // runs`` threads (8 cores: 2 runs x 4 threads). Small edge
models stop scaling past about 4 intra-op threads (and big.LITTLE parts have
4 fast cores), so extra cores serve more requests at once instead. The gpu
worker runs one plan at a time (an in-order device queue gains nothing from
more); a cloud worker allows 4 requests in flight (network-bound).

The cpu worker counts its slots in cores: a run on a plan's own session takes
``intra_op_threads`` of them, a run on a one-thread session (``single_thread.py``)
takes one, so on 2 cores either one two-thread run or two one-thread runs go at once
(what Triton users get from two CPU instances of a model). Other devices count runs.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import deque
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

CORES_PER_RUN = 4
_SLOTS = {"gpu": 1, "cloud": 4}


@dataclass(frozen=True)
class CpuSplit:
    concurrent_runs: int
    intra_op_threads: int


def cpu_split(cores: int) -> CpuSplit:
    """How ``cores`` usable cores are shared between concurrent runs (see the module docstring)."""
    cores = max(1, int(cores))
    runs = max(1, cores // CORES_PER_RUN)
    return CpuSplit(runs, max(1, cores // runs))


class DeviceWorker:
    """Run slots of one device. Loops take slots; a slot is given back by whoever holds it (a worker
    thread that found no next batch), so the counts are guarded by a lock; ``submit`` runs the work
    in this device's threads. ``units_per_run`` is what a run takes by default (the cpu worker: its
    intra-op threads, in cores); ``slots`` runs of that width fit, and narrower runs more.

    A scheduler that finds no free slot registers a callback with
    ``when_free``; every release calls the registered callbacks (in
    registration order) on their loops, and they try again.
    """

    def __init__(self, device: str, slots: int, executor: Executor | None = None, units_per_run: int = 1) -> None:
        self.device = device
        self.slots = max(1, slots)
        self.run_units = max(1, units_per_run)
        self.capacity = self.slots * self.run_units  # units (cores on the cpu worker)
        self.in_use = 0  # units held by runs in flight
        self._lock = threading.Lock()
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, Callable[[], None], object]] = deque()
        self._own_executor = executor is None
        # As many threads as one-unit runs can be in flight at once.
        self._executor = executor or ThreadPoolExecutor(self.capacity, thread_name_prefix=f"edge-runtime-{device}")

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def others_waiting(self, owner: object) -> bool:
        """Whether a waiter registered by someone other than ``owner`` (a scheduler) waits for a slot."""
        with self._lock:
            return any(waiter is not owner for _, _, waiter in self._waiters)

    def wait_runs(self) -> float:
        """Roughly how many run-lengths a new run would wait for a slot (0 when one is free)."""
        if self.has_room():
            return 0.0
        return (self.waiting + 1) / self.slots

    def has_room(self, units: int | None = None) -> bool:
        """Whether a run of ``units`` (default: a full run) would find them free now."""
        return self.in_use + (units or self.run_units) <= self.capacity

    def try_acquire(self, units: int | None = None) -> bool:
        """Take ``units`` (default: a full run's) if they are free (on a loop)."""
        units = units or self.run_units
        with self._lock:
            if self.in_use + units <= self.capacity:
                self.in_use += units
                return True
            return False

    def when_free(self, callback: Callable[[], None], owner: object = None, units: int = 1) -> None:
        """Call ``callback`` (soon, on the current loop) after the next release, or now if ``units`` came
        free first; ``owner`` (the waiting scheduler) lets ``others_waiting`` tell its own waiters apart."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.in_use + units > self.capacity:
                self._waiters.append((loop, callback, owner))
                return
        loop.call_soon(callback)  # released between the caller's check and now: no wake-up is lost

    def release(self, units: int | None = None) -> None:
        """Give ``units`` back (default: a full run's; any thread) and wake every waiter to try again."""
        with self._lock:
            self.in_use = max(0, self.in_use - (units or self.run_units))
            waiters, self._waiters = self._waiters, deque()
        for loop, callback, _ in waiters:
            if not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(callback)
                except RuntimeError:  # NOTE: closed between the check and the call
                    pass

    def submit(self, call: Callable[..., Any], *args: Any) -> Future:
        """``call(*args)`` in this device's threads; the event loop never blocks."""
        return self._executor.submit(call, *args)

    def close(self) -> None:
        if self._own_executor:
            self._executor.shutdown(wait=False, cancel_futures=True)


class DeviceWorkers:
    """The workers of one process (or one runtime), created on first use per device.

    ``cpu_cores`` sets the cpu worker's slots through ``cpu_split``; with a
    shared ``executor`` every device submits there (slots still bound each
    device), else each device gets its own threads.
    """

    def __init__(self, executor: Executor | None = None, cpu_cores: int | None = None) -> None:
        self._executor = executor
        self.cpu = cpu_split(cpu_cores or os.cpu_count() or 1)
        self._workers: dict[str, DeviceWorker] = {}

    def worker(self, device: str) -> DeviceWorker:
        if device not in self._workers:
            if device == "cpu":
                worker = DeviceWorker(device, self.cpu.concurrent_runs, self._executor, self.cpu.intra_op_threads)
            else:
                worker = DeviceWorker(device, _SLOTS.get(device, 1), self._executor)
            self._workers[device] = worker
        return self._workers[device]

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()
