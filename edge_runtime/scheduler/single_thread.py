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

Under load the cheaper session is the one that serves more rows per core, not per second:
the scheduler asks ``session_for`` at dispatch, and a run on the one-thread session takes one
of the cpu worker's cores (``workers.py``), so on 2 cores two such runs go at once. When
another run is in flight or more requests wait than this run takes (``throughput``), the
pool's ms per row counts times its threads; alone, as measured. On the classifier above a
batch of 8 rows costs 0.55 ms a row on the pool (two threads: 1.1 core-ms) and 0.96 on one
thread, so one run alone goes to the pool and runs under load go two at a time on one
thread each. Served unbatched at c=16 on 2 cores (nghttp2's h2load as the client), that took
the classifier from 935-1,046 to 1,224-1,257 requests/s. The choice made at dispatch is the
one the run uses (``forced``): the scheduler takes its cores before the run starts.

Both sessions compute the same graph; results may differ in the last bits where a kernel
splits a sum over threads.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from edge_runtime.heap_trim import release_free_heap

__all__ = ["EXPLORE_EVERY", "MAX_RUN_MS", "MIN_RUNS", "SingleThreadSwitch"]

log = logging.getLogger(__name__)

MIN_RUNS = 3  # counted runs on each session before a key is decided
EXPLORE_EVERY = 64  # runs of a decided key between two runs on the session it does not serve by
MAX_RUN_MS = 5.0  # pool runs of a key longer than this: the key stays on the pool, never tried on one thread
ALPHA = 0.2  # EWMA weight of a new run
MAX_KEYS = 64  # input-shape keys remembered (least recently used dropped first)
BUILD_JOIN_S = 30.0  # close() waits this long at most for a build in progress

Run = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
SESSIONS = ("pool", "single")


class _Key:
    """What is known of one input-shape key: runs seen and EWMA ms per row, per session."""

    __slots__ = ("rows", "seen", "ms_per_row", "since_explore")

    def __init__(self, rows: int) -> None:
        self.rows = rows  # rows of each run of this key (the long-run bound is on a run, not a row)
        self.seen = {"pool": 0, "single": 0}
        self.ms_per_row: dict[str, float] = {}
        self.since_explore = 0

    def counted(self, session: str) -> int:
        return max(0, self.seen[session] - 1)  # the first run of a key on a session is not counted

    def short(self) -> bool:
        """Whether the pool's runs of this key are measured and short enough to try on one thread."""
        pool_ms = self.ms_per_row.get("pool")
        return self.counted("pool") >= MIN_RUNS and pool_ms is not None and pool_ms * self.rows <= MAX_RUN_MS

    def choose(self, single_ready: bool, pool_threads: int = 1) -> str:
        """The session for the next run; ``pool_threads`` > 1 compares cost per core (under load)."""
        if not single_ready or not self.short():
            return "pool"
        if self.counted("single") < MIN_RUNS:
            return "single"
        weight = {"pool": float(pool_threads), "single": 1.0}
        best = min(SESSIONS, key=lambda s: self.ms_per_row[s] * weight[s])
        self.since_explore += 1
        if self.since_explore >= EXPLORE_EVERY:
            self.since_explore = 0
            return "pool" if best == "single" else "single"
        return best


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

    def session_for(self, shapes: Mapping[str, tuple[int, ...]], *, throughput: bool) -> str:
        """At dispatch: the session a run of inputs shaped ``shapes`` goes to (``"pool"`` or
        ``"single"``); ``throughput``: other runs are in flight or waiting, so cost per core decides.
        Hand the answer to ``forced`` around the run."""
        key, rows = _key_of(shapes)
        with self._lock:
            entry = self._entry(key, rows)
            return entry.choose(self._runs["single"] is not None, self.pool_threads if throughput else 1)

    @contextlib.contextmanager
    def forced(self, session: str | None) -> Iterator[None]:
        """This thread's runs inside the block go to ``session`` (None: chosen by the run, as alone)."""
        previous = getattr(self._forced, "session", None)
        self._forced.session = session
        try:
            yield
        finally:
            self._forced.session = previous

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
            previous = entry.ms_per_row.get(session)
            entry.ms_per_row[session] = sample if previous is None else previous + ALPHA * (sample - previous)
            if self._runs["single"] is None and entry.short():
                self._start_build()

    def choice(self, feeds: Mapping[str, Any], *, throughput: bool = False) -> str | None:
        """The session runs of ``feeds``' shapes (arrays or shapes) are served by now, alone or under
        load (``throughput``), leaving exploration aside (None: not decided yet)."""
        key, _ = _key_of(feeds)
        weight = {"pool": float(self.pool_threads) if throughput else 1.0, "single": 1.0}
        with self._lock:
            entry = self._keys.get(key)
            if entry is None or not entry.short() or entry.counted("single") < MIN_RUNS:
                return None
            return min(SESSIONS, key=lambda s: entry.ms_per_row[s] * weight[s])

    def snapshot(self) -> dict[str, object]:
        """Runs per session and, per decided input-shape key (latest 8), ms per row on each."""
        with self._lock:
            keys = {}
            for key, entry in list(self._keys.items())[-8:]:
                if entry.ms_per_row:
                    label = " ".join(f"{name}:{'x'.join(map(str, shape))}" for name, shape in key)
                    keys[label] = {s: round(ms, 4) for s, ms in entry.ms_per_row.items()}
            return {"runs": dict(self.runs), "ms_per_row": keys}

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
