"""Short runs on one thread: a small CPU model's single-thread session beside its pool session.

ONNX Runtime splits every kernel of a run over its intra-op pool. For a small model at one
row that split costs more than it saves, and it keeps every core busy for the run. On the
PP-OCR classifier (2 cores, in process, best of 5 rounds): one row takes 0.83 ms on one
thread against 0.94 ms on two threads with the daemon's spin settings (0.87-0.90 ms in ORT's
default session), while a batch of 8 takes 0.77 ms per row on one thread against 0.47 on
two. Served unbatched at c=16 (the load generator on the same two cores), one thread gave
996 req/s against 683: the other core stays free for the event loop and the clients. So
neither thread count is right for every run.

``SingleThreadSwitch`` is a cpu plan's ``call``: the model's own (pool) session, or a second
session with one intra-op thread (no pool: nothing spins, nothing to wake), chosen per run
by measurement, not by a rule of thumb. Runs are keyed by their input shapes; for each key it
keeps an EWMA of the wall time per row on each session (the first run of a key on a session
is not counted: ORT plans its memory then) and serves the key by the cheaper one once both
have ``MIN_RUNS`` counted runs: first the pool's, then the one thread's; afterwards one run in
``EXPLORE_EVERY`` goes to the other session, so a choice made under other load is measured
again. A key whose pool runs take more than ``MAX_RUN_MS`` stays on the pool without trying
one thread: a long run is worth splitting, and a try would cost a request up to twice its time.
The one-thread session is built the first time a key qualifies, in a background thread (the
runs stay on the pool meanwhile): a model whose runs are all long never holds it, and the
daemon's idle memory grows only by what the short models' second sessions take.

Under load an unbatched model's cheaper session is the one that serves more rows per core,
not per second: the scheduler asks ``plan_run`` at dispatch, and a run bound to the one-thread
session takes one of the cpu worker's cores (``workers.py``), so on 2 cores two such runs go at
once. When another run is in flight or more requests wait (``throughput``), the pool's ms per
row counts times its threads (and ``SIDE_BY_SIDE_MARGIN``); alone, as measured. On the
classifier one row costs 0.92 ms on one thread and 1.21 on the two-thread pool (2.4 core-ms):
served unbatched at c=16 on 2 cores (``tools/bench_server.py``), two one-thread runs side by
side took it from 922 to 1,206-1,226 requests/s (1.06x to 1.45-1.58x ORT one at a time). The session chosen at dispatch is the one the run uses (``bind``):
the scheduler takes its cores before the run starts. Runs too short to pay for their own
Python (``SIDE_BY_SIDE_MIN_MS``) and a batching model's runs keep every core, one at a time,
the session chosen when the run starts, as before.

Both sessions compute the same graph; results may differ in the last bits where a kernel
splits a sum over threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from edge_runtime.heap_trim import release_free_heap

__all__ = ["EXPLORE_EVERY", "MAX_RUN_MS", "MIN_RUNS", "SIDE_BY_SIDE_MIN_MS", "RunPlan", "SingleThreadSwitch"]

log = logging.getLogger(__name__)

MIN_RUNS = 3  # counted runs on each session before a key is decided
EXPLORE_EVERY = 64  # runs of a decided key between two runs on the session it does not serve by
MAX_RUN_MS = 5.0  # pool runs of a key longer than this: the key stays on the pool, never tried on one thread
# One-thread runs shorter than this (the fastest measured) never go side by side: the scheduler's own
# Python per run (~0.1 ms, holding the GIL) is then most of a run, and two at once only contend for it
# (the zoo's mlp, 7 us runs, served unbatched at c=16 in process, alternating: 6,950-7,080 rows/s side
# by side against 8,340-8,770 one run at a time).
SIDE_BY_SIDE_MIN_MS = 0.1
# Under load one thread must cost this much less per core than the pool to go side by side: such runs
# pay more of the GIL's contention than their own times show. A choice, not a measurement: the
# classifier's row costs 0.92 ms on one thread against 2.4 core-ms on the pool, far beyond it.
SIDE_BY_SIDE_MARGIN = 0.85
ALPHA = 0.2  # EWMA weight of a new run
MAX_KEYS = 64  # input-shape keys remembered (least recently used dropped first)
BUILD_JOIN_S = 30.0  # close() waits this long at most for a build in progress

Run = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
SESSIONS = ("pool", "single")


class _Key:
    """What is known of one input-shape key: runs seen and EWMA ms per row, per session."""

    __slots__ = ("rows", "seen", "ms_per_row", "fastest", "since_explore", "since_batch")

    def __init__(self, rows: int) -> None:
        self.rows = rows  # rows of each run of this key (the long-run bound is on a run, not a row)
        self.seen = {"pool": 0, "single": 0}
        self.ms_per_row: dict[str, float] = {}
        # The fastest counted run per session: what the run itself costs. Under load a run's time also
        # holds its wait for the GIL after ONNX Runtime returns, which inflates the average of short runs.
        self.fastest: dict[str, float] = {}
        self.since_explore = 0
        self.since_batch = 0  # one-row runs sent beside another instead of into a batch (beside_batches)

    def counted(self, session: str) -> int:
        return max(0, self.seen[session] - 1)  # the first run of a key on a session is not counted

    def short(self) -> bool:
        """Whether the pool's runs of this key are measured and short enough to try on one thread."""
        pool_ms = self.ms_per_row.get("pool")
        return self.counted("pool") >= MIN_RUNS and pool_ms is not None and pool_ms * self.rows <= MAX_RUN_MS

    def decided(self) -> bool:
        return self.short() and self.counted("single") >= MIN_RUNS

    def side_by_side(self) -> bool:
        """Whether a one-thread run of this key is long enough to run beside another."""
        single_ms = self.fastest.get("single")
        return single_ms is not None and single_ms * self.rows >= SIDE_BY_SIDE_MIN_MS

    def cheaper(self, pool_threads: int = 1) -> str:
        """The session measured cheaper (both measured): per run, or with ``pool_threads`` > 1 per core
        where a one-thread run may go beside another (the pool's row counted once per thread)."""
        weight = {"pool": 1.0, "single": 1.0}
        if pool_threads > 1 and self.side_by_side():
            weight["pool"] = pool_threads * SIDE_BY_SIDE_MARGIN
        return min(SESSIONS, key=lambda s: self.ms_per_row[s] * weight[s])

    def choose(self, single_ready: bool, pool_threads: int = 1) -> str:
        """The session for the next run; ``pool_threads`` > 1 compares cost per core (under load,
        where a one-thread run of this key may go beside another)."""
        if not single_ready or not self.short():
            return "pool"
        if self.counted("single") < MIN_RUNS:
            return "single"
        best = self.cheaper(pool_threads)
        self.since_explore += 1
        if self.since_explore >= EXPLORE_EVERY:
            self.since_explore = 0
            return "pool" if best == "single" else "single"
        return best


@dataclass(frozen=True)
class RunPlan:
    """How one run goes: on which ``session``, and whether it may run ``beside`` another (a one-thread
    run long enough to pay for its own Python: one core of the worker)."""

    session: str | None  # None: chosen when the run starts (``__call__``), as for a run alone
    beside: bool


class SingleThreadSwitch:
    """A cpu plan's ``call``: each run on the pool session or the single-thread one (module docstring).

    ``single`` is the one-thread session's run, or ``build`` makes it (a loaded ``Model``) the
    first time a shape qualifies: in a background thread, the runs staying on the pool until it
    is ready, so a model whose runs are all long never holds a second session. ``runs`` counts
    the runs per session for the scheduler's stats; ``close()`` closes a built model.
    """

    def __init__(self, pool: Run, single: Run | None = None, *, build: Callable[[], Any] | None = None,
                 clock: Callable[[], float] = time.perf_counter, pool_threads: int = 1) -> None:
        if (single is None) == (build is None):
            raise ValueError("give the one-thread session's run or a way to build it, not both")
        self.pool = pool  # the model's own run (its pool session, or the spin policy's switch)
        self.pool_threads = max(1, pool_threads)  # the pool session's intra-op threads (cores a run takes)
        self._forced = threading.local()  # a session chosen at dispatch for this thread's next run
        self._runs: dict[str, Run | None] = {"pool": pool, "single": single}
        self._build = build
        self._building: threading.Thread | None = None
        self.single_model: Any = None  # the built one-thread Model
        self.build_error: str | None = None
        self._clock = clock
        self.runs = {"pool": 0, "single": 0}
        self._keys: OrderedDict[tuple, _Key] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        key, rows = _key_of(feeds)
        forced = getattr(self._forced, "session", None)
        with self._lock:
            entry = self._entry(key, rows)
            if forced is not None and self._runs[forced] is not None:
                session = forced
            else:  # not chosen at dispatch, or the one-thread session closed since
                session = entry.choose(self._runs["single"] is not None) if forced is None else "pool"
            self.runs[session] += 1
            run = self._runs[session]
        started = self._clock()
        outputs = run(feeds)
        self.observe(key, rows, session, (self._clock() - started) * 1e3)
        return outputs

    def plan_run(self, shapes: Mapping[str, Any], *, throughput: bool) -> RunPlan:
        """At dispatch: the session a run of inputs ``shapes`` (arrays or shapes) goes to (``bind`` it)
        and whether it may run beside another; ``throughput``: other runs are in flight or waiting,
        so cost per core decides."""
        ready = self._runs["single"] is not None
        key, rows = _key_of(shapes)
        with self._lock:
            entry = self._entry(key, rows)
            if not (throughput and entry.side_by_side()):  # as alone: the run chooses when it starts
                return RunPlan(None, False)
            session = entry.choose(ready, self.pool_threads)
            return RunPlan(session, session == "single")

    def beside_batches(self, shapes: Mapping[str, Any], batch_row_ms: float, *, explore: bool = True) -> bool:
        """Under load, for a batching model: whether a one-row run of ``shapes`` on the one-thread
        session, beside another run, costs less per core than the pool's batches at ``batch_row_ms`` a
        row (their best size, measured: ``CostCurve.batch_row_ms``), the margin and each run's own
        Python counted as for unbatched runs. Decided once the one-row key's one-thread runs are
        measured (until then its short runs go there to be measured); one request in ``EXPLORE_EVERY``
        still joins a batch, so the batches' cost is measured again under today's load (``explore``
        False: the choice alone, nothing counted)."""
        if self._runs["single"] is None:
            return False
        key, rows = _key_of(shapes)
        with self._lock:
            entry = self._keys.get(key)
            if entry is None or rows != 1 or not entry.short():
                return False
            if entry.counted("single") < MIN_RUNS:
                return True  # measure the one thread first: a short run, bounded by MAX_RUN_MS
            # The one-thread row at its fastest (what the run costs: under load the average also holds the
            # wait for the GIL after ONNX Runtime returns, ~1 ms a run on the classifier at c=16, where a
            # core is idle, not busy) plus the scheduler's own Python a run, paid per row here and per
            # batch there; the batches' row at its EWMA, counted once per pool thread.
            if (not entry.side_by_side() or entry.fastest["single"] + SIDE_BY_SIDE_MIN_MS
                    >= batch_row_ms * self.pool_threads * SIDE_BY_SIDE_MARGIN):
                return False
            if not explore:
                return True
            entry.since_batch += 1
            if entry.since_batch >= EXPLORE_EVERY:
                entry.since_batch = 0
                return False
            return True

    def bind(self, session: str | None) -> None:
        """This thread's next runs go to ``session`` until bound to None (chosen by the run, as alone).
        (A method rather than a context manager: it is on every run's path.)"""
        self._forced.session = session

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait for a build in progress; whether the one-thread session is there."""
        building = self._building
        if building is not None:
            building.join(timeout_s)
        return self._runs["single"] is not None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            building = self._building
        if building is not None:
            building.join(BUILD_JOIN_S)
        with self._lock:
            model, self.single_model = self.single_model, None
            self._runs["single"] = None
        if model is not None:
            model.close()

    def _start_build(self) -> None:
        """Build the one-thread session off the caller's thread, once (caller holds the lock)."""
        if self._build is None or self._building is not None or self._closed:
            return
        self._building = threading.Thread(target=self._build_single, name="edge-runtime-single-thread",
                                          daemon=True)
        self._building.start()

    def _build_single(self) -> None:
        try:
            model = self._build()
        except Exception as exc:  # a load failure leaves the pool serving every run
            self.build_error = f"{type(exc).__name__}: {exc}"
            log.warning("one-thread session not built (%s): every run stays on the pool session", self.build_error)
            return
        finally:
            release_free_heap()  # this thread's malloc arena keeps the load's freed pages otherwise
        with self._lock:
            if self._closed:
                closing = model
            else:
                closing = None
                self.single_model = model
                self._runs["single"] = model._run_validated
        if closing is not None:
            closing.close()

    def observe(self, key: tuple, rows: int, session: str, ms: float) -> None:
        """A run of ``rows`` rows with input shapes ``key`` took ``ms`` on ``session``."""
        with self._lock:
            entry = self._entry(key, rows)
            if not ms > 0:
                return  # a clock that did not move says nothing
            entry.seen[session] += 1
            if entry.seen[session] == 1:
                return
            sample = ms / rows
            entry.fastest[session] = min(sample, entry.fastest.get(session, sample))
            previous = entry.ms_per_row.get(session)
            entry.ms_per_row[session] = sample if previous is None else previous + ALPHA * (sample - previous)
            if self._runs["single"] is None and entry.short():
                self._start_build()

    def choice(self, feeds: Mapping[str, Any], *, throughput: bool = False) -> str | None:
        """The session runs of ``feeds``' shapes (arrays or shapes) are served by now, alone or under
        load (``throughput``), leaving exploration aside (None: not decided yet)."""
        key, _ = _key_of(feeds)
        with self._lock:
            entry = self._keys.get(key)
            if entry is None or not entry.decided():
                return None
            return entry.cheaper(self.pool_threads if throughput else 1)

    def snapshot(self) -> dict[str, object]:
        """Runs per session and, per decided input-shape key (latest 8), ms per row on each; ``beside``:
        the keys whose one-thread runs are long enough to go beside another under load."""
        with self._lock:
            keys, beside = {}, []
            for key, entry in list(self._keys.items())[-8:]:
                if entry.ms_per_row:
                    label = " ".join(f"{name}:{'x'.join(map(str, shape))}" for name, shape in key)
                    keys[label] = {s: round(ms, 4) for s, ms in entry.ms_per_row.items()}
                    if entry.side_by_side():
                        beside.append(label)
            return {"runs": dict(self.runs), "ms_per_row": keys, "beside": beside}

    def _entry(self, key: tuple, rows: int) -> _Key:
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = _Key(max(1, rows))
            while len(self._keys) > MAX_KEYS:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(key)
        return entry


def _key_of(feeds: Mapping[str, Any]) -> tuple[tuple, int]:
    """(the feeds' names and shapes, the rows of a run: dim 0 of the first input by name, 1 for a scalar;
    batched inputs share dim 0, so any one of them says it). Values are arrays or their shapes."""
    key = tuple(sorted((name, tuple(value) if isinstance(value, tuple) else tuple(np.shape(value)))
                       for name, value in feeds.items()))
    first = key[0][1] if key else ()
    return key, int(first[0]) if first and first[0] > 0 else 1
