"""``auto`` checked against reality: the candidate plans timed on the real model.

The cost model estimates every candidate plan (``cpu``, ``gpu``, ``hybrid``,
``auto`` where an accelerator exists; the CPU engines, ORT and ``ncnn``, which
it cannot tell apart, race each other first in ``engine_choice``, whose
``race_runners`` this reuses); the estimate only prunes (a plan estimated over
``PRUNE_RATIO`` times the best is not timed; ``cpu`` always is). The rest are
compiled and run on seeded feeds at the served input shape, interleaved, best
of rounds (``engine_choice.race_runners``), within ``RACE_BUDGET_S``; the
fastest measured wins, a plan off the host only by ``HOST_PREFERENCE``.

A candidate that cannot compile within ``COMPILE_BUDGET_S`` or run at that
shape drops out, said in its entry and at DEBUG (a synthetic shape a model rejects is not a fault). The
served shape is the caller's ``input_shapes``, else the static dims, else the
first of ``DEFAULT_SIDES`` the model takes on ONNX Runtime.

``race_child`` runs this in a short-lived child process and ``decide_plan``
caches the verdict; see there.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from backends.base import CompileOptions
from backends.errors import EdgeRuntimeError

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from edge_runtime.runtime import Runtime

log = logging.getLogger(__name__)

RACE_BUDGET_S = 2.0
PRUNE_RATIO = 3.0
"""A plan estimated this many times slower than the best estimate is not timed."""
HOST_PREFERENCE = 1.05
"""A plan off the host wins only when measured this much faster than ``cpu``: within noise, the host
keeps the model (no GPU driver mapped, no copies, no kernel builds at start)."""
COMPILE_BUDGET_S = 30.0
"""A candidate whose compile takes longer drops out of this race (a first kernel build of a large model
on a slow device takes minutes; loading must not wait for it). The verdict is then not cached, so a
later start, with the driver's kernel cache warmer, races it again."""
CANDIDATE_MARGIN = 1.3
"""Candidates measured within this factor of the winner stay compiled for live plan switching."""
DEFAULT_SIDES = (64, 224, 48, 320)
"""Sizes tried for unknown non-batch dims, in order, until ONNX Runtime runs the model."""


@dataclass(frozen=True)
class RaceEntry:
    """One candidate: its estimate, its measurement (median of best-of rounds), or why it has none."""

    name: str
    kind: str  # "plan" (an engine, should one race here later, would say "engine")
    backends: tuple[str, ...]
    est_ms: float | None
    measured_ms: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "backends": list(self.backends)}


@dataclass(frozen=True)
class PlanDecision:
    """The measured verdict of ``auto``: the winner, every candidate's entry, and where it was decided
    (``in-process``, ``child``, or ``cache`` when read back)."""

    winner: str
    kind: str
    shapes: dict[str, tuple[int, ...]]
    entries: tuple[RaceEntry, ...]
    reason: str
    where: str = "in-process"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def entry(self, name: str) -> RaceEntry | None:
        return next((e for e in self.entries if e.name == name), None)

    def close_candidates(self, margin: float = CANDIDATE_MARGIN) -> tuple[RaceEntry, ...]:
        """Timed candidates besides the winner measured within ``margin`` x the winner's time."""
        best = self.entry(self.winner)
        if best is None or best.measured_ms is None:
            return ()
        return tuple(e for e in self.entries if e.name != self.winner and e.measured_ms is not None
                     and e.measured_ms <= margin * best.measured_ms)

    def to_dict(self) -> dict[str, Any]:
        return {"winner": self.winner, "kind": self.kind, "reason": self.reason, "where": self.where,
                "shapes": {k: list(v) for k, v in self.shapes.items()}, "notes": list(self.notes),
                "candidates": [e.to_dict() for e in self.entries]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PlanDecision":
        """Raises KeyError/TypeError/ValueError on a malformed object (a stale or foreign cache entry)."""
        entries = tuple(RaceEntry(str(e["name"]), str(e["kind"]), tuple(e["backends"]), e.get("est_ms"),
                                  e.get("measured_ms"), str(e.get("note", ""))) for e in data["candidates"])
        decision = cls(str(data["winner"]), str(data["kind"]), {k: tuple(int(d) for d in v) for k, v in
                                                                data["shapes"].items()},
                       entries, str(data["reason"]), str(data.get("where", "cache")), tuple(data.get("notes", ())))
        if decision.entry(decision.winner) is None:
            raise ValueError(f"winner {decision.winner!r} is not among the candidates")
        return decision


def served_shapes(model: "onnx.ModelProto", input_shapes: Mapping[str, Sequence[int]] | None,
                  run_on_host: Callable[[Mapping[str, Sequence[int]]], object]) -> tuple[dict[str, tuple[int, ...]], str]:
    """The shape to race at, and how it was found: the given/static dims, else the first default side
    the model takes (``run_on_host`` raises for one it rejects). Raises EdgeRuntimeError if none runs."""
    from backends.onnx_graph import graph_inputs
    from edge_runtime.planning import cost

    inputs = graph_inputs(model)
    dynamic = any(not (isinstance(d, int) and d >= 0) for spec in inputs if spec.name not in (input_shapes or {})
                  for d in spec.shape)
    sides = DEFAULT_SIDES if dynamic else DEFAULT_SIDES[:1]
    failures = []
    for side in sides:
        shapes = cost.bound_input_shapes(inputs, input_shapes, default_dim=side)
        try:
            run_on_host(shapes)
        except Exception as exc:  # a synthetic shape the model rejects: try the next one
            log.debug("race shape %s rejected by the host: %s: %s", shapes, type(exc).__name__, exc)
            failures.append(f"{shapes}: {type(exc).__name__}")
            continue
        how = "given" if input_shapes and set(input_shapes) >= {s.name for s in inputs} else (
            "static dims" if not dynamic else f"unknown dims bound to {side}")
        return shapes, how
    raise EdgeRuntimeError(f"no race shape runs on the host: {'; '.join(failures)}")


def race_in_process(runtime: "Runtime", model: "onnx.ModelProto", options: CompileOptions,
                    input_shapes: Mapping[str, Sequence[int]] | None, *,
                    budget_s: float = RACE_BUDGET_S, compile_budget_s: float | None = None,
                    sample: Mapping[str, np.ndarray] | None = None) -> PlanDecision:
    """Estimate, prune, compile and time the candidate plans of ``auto`` in this process (see the
    module doc). ``sample``: input values to race on where seeded ones describe no real input
    (``engine_choice.seeded_feeds``). Raises EdgeRuntimeError only when the host itself cannot run
    the model."""
    from edge_runtime.engine_choice import seeded_feeds

    # NOTE: ONNX Runtime's pool threads spin after a run; interleaved, they would take the cores
    # from the next candidate (PoCL's workers share them) and make whatever follows an ORT stage
    # look up to 2x slower. Served sessions do not spin between runs either (scheduler.spin).
    options = replace(options, allow_spinning=False)

    host = runtime.backend("cpu")
    host_exec = host.compile(model, options)
    try:
        shapes, how = served_shapes(model, input_shapes, lambda s: host_exec.run(seeded_feeds(model, s, sample)))
    finally:
        host_exec.close()
    racing = {threading.get_ident()}
    with _experiment_logging(racing):
        return _race(runtime, model, options, shapes, how, budget_s,
                     COMPILE_BUDGET_S if compile_budget_s is None else compile_budget_s, racing, sample)


def _race(runtime: "Runtime", model: "onnx.ModelProto", options: CompileOptions, shapes: dict[str, tuple[int, ...]],
          how: str, budget_s: float, compile_budget_s: float, racing: set[int],
          sample: Mapping[str, np.ndarray] | None = None) -> PlanDecision:
    from edge_runtime.engine_choice import race_runners, seeded_feeds

    feeds = seeded_feeds(model, shapes, sample)
    entries: dict[str, RaceEntry] = {}
    compiled: dict[str, Any] = {}
    try:
        for entry, build in _candidates(runtime, model, options, shapes):
            entries[entry.name] = entry
            if entry.note:
                continue
            try:
                executable = _compile_within(build, compile_budget_s, racing)
            except CompileOverBudget as exc:
                entries[entry.name] = replace(entry, note=str(exc))
                log.info("plan race: %s %s; it races again at a later start", entry.name, exc)
                continue
            except Exception as exc:  # a candidate that cannot compile drops out; the race goes on
                entries[entry.name] = replace(entry, note=f"does not compile: {type(exc).__name__}: {exc}")
                log.debug("plan race: %s does not compile: %s", entry.name, exc)
                continue
            compiled[entry.name] = executable
            failure = _strict_run(executable, feeds)
            if failure:
                entries[entry.name] = replace(entry, note=f"rejects {shapes}: {failure}")
                log.debug("plan race: %s rejects the shape %s: %s", entry.name, shapes, failure)
        runners = {name: (lambda e=executable: e.run(feeds)) for name, executable in compiled.items()
                   if not entries[name].note}
        # One candidate left (the rest pruned or dropped): one round says its time; nothing to compare.
        rounds = 9 if len(runners) > 1 else 1
        measured = race_runners(runners, budget_s=budget_s, rounds=rounds, runs_per_round=2) if runners else {}
    finally:
        for executable in compiled.values():
            executable.close()
    for name, ms in measured.items():
        entries[name] = replace(entries[name], measured_ms=ms)
    timed = [e for e in entries.values() if e.measured_ms is not None]
    if not timed:
        raise EdgeRuntimeError(f"plan race: no candidate ran: {[e.note for e in entries.values()]}")
    best = min(timed, key=lambda e: e.measured_ms * (1.0 if e.name == "cpu" else HOST_PREFERENCE))  # type: ignore
    shown = ", ".join(f"{e.name} {e.measured_ms:.3f} ms" for e in timed)
    reason = f"measured fastest at {shapes} ({how}): {shown}"
    log.info("plan race: %s wins (%s)", best.name, reason)
    return PlanDecision(best.name, best.kind, shapes, tuple(entries.values()), reason)


class CompileOverBudget(EdgeRuntimeError):
    """A candidate's compile outlasted ``COMPILE_BUDGET_S``."""


OVER_BUDGET = "compile over budget"
"""The start of an over-budget candidate's note (``plan_choice`` does not cache such a verdict)."""


def _compile_within(build: Callable[[], Any], budget_s: float, racing: set[int]) -> Any:
    """``build()`` in a daemon thread, waited for ``budget_s``. A compile that outlasts it is left to
    finish on its own and close what it built (a driver call cannot be interrupted); its thread joins
    ``racing`` so its WARNINGs are demoted like the race's own."""
    finished = threading.Event()
    lock = threading.Lock()
    state: dict[str, Any] = {"abandoned": False}

    def work() -> None:
        racing.add(threading.get_ident())
        try:
            value, error = build(), None
        except BaseException as exc:  # handed to the waiting thread below
            value, error = None, exc
        with lock:
            state["value"], state["error"] = value, error
            late = state["abandoned"]
        finished.set()
        if late and value is not None:
            value.close()

    threading.Thread(target=work, name="plan-race-compile", daemon=True).start()
    finished.wait(budget_s)
    with lock:
        if "error" not in state:  # still compiling: it closes its own result when it ends
            state["abandoned"] = True
            raise CompileOverBudget(f"{OVER_BUDGET}: not built within {budget_s:g} s")
    if state["error"] is not None:
        raise state["error"]
    return state["value"]


_EXPERIMENT_LOGGERS = ("edge_runtime.planning.plans", "edge_runtime.planning.executor")


@contextlib.contextmanager
def _experiment_logging(racing: set[int]) -> Iterator[None]:
    """While the ``racing`` threads race: a stage that does not compile or run on the accelerator is a
    race entry, not a fault, so the planner's and executor's WARNINGs from them become DEBUG."""

    def demote(record: logging.LogRecord) -> bool:
        if record.thread in racing and record.levelno == logging.WARNING:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True

    loggers = [logging.getLogger(name) for name in _EXPERIMENT_LOGGERS]
    for logger in loggers:
        logger.addFilter(demote)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(demote)


def _candidates(runtime: "Runtime", model: "onnx.ModelProto", options: CompileOptions,
                shapes: Mapping[str, Sequence[int]]) -> list[tuple[RaceEntry, Callable[[], Any]]]:
    """(entry, compile) per candidate; an entry with a ``note`` is not timed (pruned or a duplicate)."""
    out: list[tuple[RaceEntry, Callable[[], Any]]] = []
    planner = runtime.planner(model, shapes)
    seen: dict[tuple, str] = {}
    layouts = []
    for name in ("cpu", *[n for n in planner.available() if n != "cpu"]):
        try:
            layout = planner.layout(name)
        except EdgeRuntimeError as exc:
            out.append((RaceEntry(name, "plan", (), None, note=f"no layout: {exc}"), lambda: None))
            continue
        layouts.append((name, layout))
    best_est = min(layout.partition.latency_s for _, layout in layouts)
    for name, layout in layouts:
        part = layout.partition
        signature = tuple((s.backend, tuple(s.nodes)) for s in part.stages)
        entry = RaceEntry(name, "plan", tuple(part.backends), round(part.latency_s * 1e3, 4))
        if signature in seen:
            entry = replace(entry, note=f"same stages as {seen[signature]}")
        elif name != "cpu" and part.latency_s > PRUNE_RATIO * best_est:
            entry = replace(entry, note=f"pruned: estimated {part.latency_s / best_est:.1f}x the best estimate")
        seen.setdefault(signature, name)
        out.append((entry, lambda layout=layout: planner.compile(layout, options)))
    return out


def _strict_run(executable: Any, feeds: Mapping[str, Any]) -> str:
    """One run with no stage fallback (a stage re-run on the host would time the host): '' or why it failed."""
    try:
        stages = getattr(executable, "stages", None)
        if stages is None:
            executable.run(feeds)
            return ""
        env = dict(feeds)
        for stage in stages:
            env.update(stage.executable.run({t: env[t] for t in stage.spec.inputs}))
        executable.run(feeds)  # the executor's own path once: first-run allocations
        return ""
    except Exception as exc:  # reported in the candidate's entry
        return f"{type(exc).__name__}: {exc}"
