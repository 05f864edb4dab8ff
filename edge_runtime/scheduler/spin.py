"""The spin policy: when a served model's CPU pool threads may busy-wait.

An ONNX Runtime intra-op pool thread that finds no work either spins (polls for a
while) or sleeps on a futex. Spinning makes the next parallel section start at
once: on the PP-OCR classifier (2 cores, per row at batch 1 / 8 / 16) spinning
threads cost 0.95 / 0.58 / 0.53 ms, sleeping ones 1.38 / 1.09 / 0.88 ms, so a
batch saves little unless its threads spin. But a pool left spinning between
runs burns a core an idle daemon does not need, and takes it from the event
loop that parses the next requests (the issue measured unbatched c=16 throughput
falling by a third).

Means ONNX Runtime gives (verified in 1.32's library strings and its session
config keys header): the *session* entries ``session.intra_op.allow_spinning``
(spin at all), ``session.force_spinning_stop`` (stop spinning the moment the
last concurrent ``Run`` returns; spinning restarts with the next ``Run``) and
``session.intra_op.spin_duration_us`` (how long one wait spins before sleeping).
There is no *run* option for spinning (the run-options keys are arena shrinkage,
EP synchronisation and graph ids), and a session's options are fixed once built.

So the ``load`` mode (the default) uses ``allow_spinning`` with
``force_spinning_stop``: ORT's pool spins exactly while a run of the model is
in flight. Under load the scheduler keeps runs in flight back to back (a device
worker takes the next ready batch itself, ``scheduler._drive``), so the pool
spins through the whole busy period; the moment the model goes idle it stops,
and an idle daemon uses no CPU. ``never`` and ``always`` (ORT's own default:
spin after runs too) are there for measurement and for hosts where one or the
other is known to win.

How long one wait of a pool thread spins inside a run is bounded to 1 ms by
default (``[scheduler] spin_wait_us``, ``SPIN_WAIT_US``; 0 = ORT's own). A
thread whose wait ran out sleeps, and the next parallel section pays its
wake-up. An earlier bound of 100 us (meant to hand a thread waiting through a
long serial stretch of the calling thread's back to the event loop) made a
single-row run pay that in nearly every run; ORT's own unbounded spin, on the
other side, lets a preempted host's batches drag. In process on the PP-OCR
classifier (2 intra-op threads on 2 cores, other work on the host at load
average 2.8-3.9, ``python tools/bench_spin.py --waits-us 100 1000 3000
--rounds 6``), median ms per row over rounds, one row with 0.7 ms of busy work
between runs / 8 rows back to back: 100 us 1.75 / 1.98, 1 ms 1.05 / 1.77, 3 ms
1.03 / 2.65, unbounded 1.03 / 2.63, ORT's default session 1.01 / 2.65. Served
(``tools/bench_server.py``, which A/Bs the 100 us bound, two runs at load average
~2.5): c=16 batched 950 / 958 rows/s with 1 ms against 889 / 757 with 100 us;
at c=1 the daemon's p50 did not differ (1.68 / 2.12 ms against 1.69 / 1.98).

Spinning pays only while the cores are ours. When other processes keep them busy
(a cloud phone's other apps, other daemons), a spinning thread burns time slices
the others then take, and a parallel section waits for whichever of its threads
was preempted: on this 2-core host under foreign load (load average 7) the
classifier served 530 req/s at c=16 without spinning and 460 with it, where a
quiet host gives spinning the lead (the issue: 1,084 against 815). So ``load``
also watches the host: where the model is small enough (``TWIN_MAX_BYTES``) its
cpu plan holds a second, non-spinning session of the same model, and
``SpinSwitch`` sends each run to the spinning session while the others' CPU
share (``LoadMonitor``: busy minus this process's own) is at most
``OTHERS_BUSY_MAX``, else to the quiet twin. Without a monitor reading it spins.

A request on an idle model runs at once (``batching.BatchSizer``): nothing here
delays it; its run spins like any other.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from backends.base import CompileOptions
from edge_runtime.load_monitor import LoadReading
from edge_runtime.scheduler.config import SPIN_MODES, SPIN_WAIT_US

__all__ = ["OTHERS_BUSY_MAX", "SPIN_MODES", "SPIN_WAIT_US", "TWIN_MAX_BYTES", "SpinSettings", "SpinSwitch",
           "spin_settings", "spinning_now"]

# Others' share of all cores above which runs go to the quiet twin: on 2 cores, half of one core
# (a load generator beside the daemon stays under it; a second busy process does not).
OTHERS_BUSY_MAX = 0.25
# Models up to this file size get a quiet twin session (its weights and arenas cost memory again).
TWIN_MAX_BYTES = 32 * 2**20


@dataclass(frozen=True)
class SpinSettings:
    """What the compiled CPU sessions of a served model are told (``CompileOptions`` fields)."""

    allow_spinning: bool
    spin_only_in_runs: bool
    spin_duration_us: int

    def apply(self, options: CompileOptions) -> CompileOptions:
        return dataclasses.replace(options, allow_spinning=self.allow_spinning,
                                   spin_only_in_runs=self.spin_only_in_runs,
                                   spin_duration_us=self.spin_duration_us)

    def matches(self, options: CompileOptions | None) -> bool:
        """Whether ``options`` were compiled with these settings (None: unknown, so no)."""
        return options is not None and (options.allow_spinning, options.spin_only_in_runs,
                                         options.spin_duration_us) == (self.allow_spinning,
                                                                       self.spin_only_in_runs,
                                                                       self.spin_duration_us)


def spin_settings(mode: str = "load", wait_us: int = SPIN_WAIT_US) -> SpinSettings:
    """The settings of spin ``mode`` (see the module docstring); ``mode`` is checked by the config.

    ``wait_us`` (``load`` only): the longest one wait of a pool thread spins inside a run; 0 = ORT's own."""
    if mode == "never":
        return SpinSettings(False, False, 0)
    if mode == "always":
        return SpinSettings(True, False, 0)
    return SpinSettings(True, True, max(0, int(wait_us)))


def spinning_now(mode: str, runs_in_flight: int) -> bool:
    """Whether the model's pool threads may spin now: in ``load`` mode while a run is in flight."""
    if mode == "never":
        return False
    return mode == "always" or runs_in_flight > 0


Run = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


class SpinSwitch:
    """A cpu plan's ``call``: each run on the spinning session or its quiet twin, by the host's other load.

    ``reading`` returns the latest ``LoadReading`` (the ``LoadMonitor``'s); ``runs`` counts
    the runs per session (``spinning``, ``quiet``) for the scheduler's stats.
    """

    def __init__(self, spinning: Run, quiet: Run, reading: Callable[[], LoadReading],
                 others_busy_max: float = OTHERS_BUSY_MAX) -> None:
        self._spinning, self._quiet, self._reading = spinning, quiet, reading
        self.others_busy_max = others_busy_max
        self.runs = {"spinning": 0, "quiet": 0}
        self.quiet_model: object = None  # the twin's Model, when the factory built it (closed with the scheduler)
        self._lock = threading.Lock()

    def spin_now(self) -> bool:
        """Whether the next run spins: the others' CPU share is unknown or at most the bound."""
        others = self._reading().cpu_busy_others
        return others is None or others <= self.others_busy_max

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        spin = self.spin_now()
        with self._lock:
            self.runs["spinning" if spin else "quiet"] += 1
        return (self._spinning if spin else self._quiet)(feeds)
