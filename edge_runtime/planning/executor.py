"""``PlanExecutor``: runs a plan's compiled stages, handing named tensors along.

A stage gets exactly its input tensors; a tensor is dropped as soon as no
later stage needs it (graph outputs are kept). A stage that fails at run time
(``BackendError`` as the contract says, or any other exception: a backend
disagreeing about its input, a raw driver error) is re-run on the host backend
for that request: the CPU version of the stage is compiled on
first need, the fallback is counted in ``fallbacks`` by stage, backend and
reason, logged as a warning, and reported (``last_fallback``,
``run_reporting``). It is never silent.

The executor satisfies both the ``Executable`` contract (so a ``Model`` can
wrap it) and the scheduler's ``Plan`` protocol (``name``, ``backends``, ``run``).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from backends.base import Executable, TensorSpec
from backends.errors import BackendError, EdgeRuntimeError
from edge_runtime.planning.layout import StageSpec
from edge_runtime.planning.pipeline import run_pipelined
from edge_runtime.planning.runs import PlanRun, StageNote

__all__ = ["CompiledStage", "FallbackKey", "PlanExecutor", "PlanRun", "StageNote"]

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

FallbackCompiler = Callable[["onnx.ModelProto"], Executable]


@dataclass(frozen=True)
class FallbackKey:
    """Label set of one fallback counter: which stage, which backend failed, and why."""

    stage: str
    backend: str
    reason: str


@dataclass
class CompiledStage:
    """A stage ready to run: its spec, executable, subgraph (for a fallback) and node counts."""

    spec: StageSpec
    executable: Executable
    model: "onnx.ModelProto | None"
    backend_nodes: dict[str, int]
    compile_note: str | None = None  # set when the stage was meant for another backend
    fallback: Executable | None = None
    lock: threading.Lock | None = field(default=None, repr=False)

    @property
    def backend(self) -> str:
        return self.spec.backend


class PlanExecutor:
    """Runs stages in order; see the module docstring for the fallback contract."""

    def __init__(self, name: str, stages: Sequence[CompiledStage], inputs: list[TensorSpec],
                 outputs: list[TensorSpec], *, host: str = "cpu",
                 compile_fallback: FallbackCompiler | None = None, estimated_ms: float | None = None) -> None:
        if not stages:
            raise ValueError("a plan needs at least one stage")
        self.name = name
        self.stages = list(stages)
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.host = host
        self.backends = tuple(dict.fromkeys(s.backend for s in self.stages))
        self.fallbacks: Counter[FallbackKey] = Counter()
        self.thread_safe = True  # stages whose executable is not get a lock each
        self.estimated_ms = estimated_ms  # the cost model's latency estimate (the scheduler's prior)
        self._compile_fallback = compile_fallback
        self._fallback_lock = threading.Lock()
        self._local = threading.local()
        for stage in self.stages:
            if not getattr(stage.executable, "thread_safe", False):
                stage.lock = threading.Lock()
        graph_outputs = {spec.name for spec in outputs}
        last_use: dict[str, int] = {}
        for k, stage in enumerate(self.stages):
            for tensor in stage.spec.inputs:
                last_use[tensor] = k
        # release[k]: tensors nobody needs once stage k has run.
        self._release: list[list[str]] = [[] for _ in self.stages]
        for tensor, k in last_use.items():
            if tensor not in graph_outputs:
                self._release[k].append(tensor)

    # -- running -------------------------------------------------------------------
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs for validated ``feeds``; ``last_fallback`` then says whether a stage fell back."""
        return self.run_reporting(feeds).outputs

    def run_reporting(self, feeds: Mapping[str, np.ndarray]) -> PlanRun:
        env = dict(feeds)
        notes: list[StageNote] = []
        for k in range(len(self.stages)):
            self.advance(k, env, notes)
        result = PlanRun.of(self.collect(env), notes)
        self._local.last_fallback = result.fallback
        return result

    def run_many(self, feeds_list: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """Outputs of several requests, stages overlapping across requests (see ``pipeline``)."""

        return [r.outputs for r in run_pipelined(self, feeds_list)]

    @property
    def last_fallback(self) -> str | None:
        """What fell back during this thread's latest ``run`` (None: nothing did)."""
        return getattr(self._local, "last_fallback", None)

    def advance(self, k: int, env: dict[str, np.ndarray], notes: list[StageNote]) -> None:
        """Run stage ``k`` on the tensors in ``env``, add its outputs, drop what is no longer needed."""
        stage = self.stages[k]
        feeds = {t: env[t] for t in stage.spec.inputs}
        try:
            outputs = _call(stage.executable, feeds, stage.lock)
        except Exception as exc:  # any failure of a non-host stage: answer this request on the host
            if stage.backend == self.host:
                raise
            contracted = isinstance(exc, EdgeRuntimeError)
            if not contracted:  # a backend broke its contract (raw driver error): keep the traceback
                log.warning("plan %s: stage %d (%s) raised %s", self.name, k, stage.backend,
                            type(exc).__name__, exc_info=True)
            reason = type(exc).__name__ if contracted else f"unexpected {type(exc).__name__}"
            outputs = self._fall_back(k, feeds, exc, reason)
            notes.append(StageNote(f"stage {k} ({stage.backend}) re-ran on {self.host}: {type(exc).__name__}: {exc}",
                                   stage.backend, reason))
        for tensor in stage.spec.outputs:
            env[tensor] = outputs[tensor]
        for tensor in self._release[k]:
            env.pop(tensor, None)

    def collect(self, env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {spec.name: env[spec.name] for spec in self.outputs}

    def _fall_back(self, k: int, feeds: dict[str, np.ndarray], exc: BaseException, reason: str) -> dict[str, np.ndarray]:
        stage = self.stages[k]
        with self._fallback_lock:  # Counter updates are not atomic; stages run in several threads
            self.fallbacks[FallbackKey(f"stage{k}", stage.backend, reason)] += 1
        log.warning("plan %s: stage %d on %s failed (%s); re-running it on %s for this request",
                    self.name, k, stage.backend, exc, self.host)
        try:
            return _call(self.fallback_executable(k), feeds, None)
        except EdgeRuntimeError as second:
            raise BackendError(f"plan {self.name!r}: stage {k} failed on {stage.backend} ({exc}) "
                               f"and on {self.host} ({second})") from second

    def fallback_executable(self, k: int) -> Executable:
        """The host version of stage ``k``, compiled on first call (thread-safe)."""
        stage = self.stages[k]
        with self._fallback_lock:
            if stage.fallback is None:
                if self._compile_fallback is None or stage.model is None:
                    raise BackendError(f"plan {self.name!r}: stage {k} has no {self.host} fallback")
                stage.fallback = self._compile_fallback(stage.model)
            return stage.fallback

    # -- reporting -----------------------------------------------------------------
    @property
    def backend_nodes(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for stage in self.stages:
            counts.update(stage.backend_nodes)
        return dict(counts)

    def describe(self) -> dict[str, Any]:
        stages = []
        for k, stage in enumerate(self.stages):
            entry = {"stage": k, "backend": stage.backend, "node_count": sum(stage.backend_nodes.values()),
                     "inputs": list(stage.spec.inputs), "outputs": list(stage.spec.outputs),
                     "est_ms": round(stage.spec.est_s * 1e3, 4)}
            if stage.compile_note:
                entry["compile_fallback"] = stage.compile_note
            stages.append(entry)
        return {"backend": "+".join(self.backends), "plan": self.name, "est_ms": self.estimated_ms, "stages": stages,
                "fallbacks": [{"stage": key.stage, "backend": key.backend, "reason": key.reason, "count": n}
                              for key, n in sorted(self.fallbacks.items(),
                                                   key=lambda kv: (int(kv[0].stage[len("stage"):]), kv[0].reason))]}

    def close(self) -> None:
        for stage in self.stages:
            stage.executable.close()
            if stage.fallback is not None:
                stage.fallback.close()


def _call(executable: Executable, feeds: dict[str, np.ndarray], lock: threading.Lock | None) -> dict[str, np.ndarray]:
    if lock is None:
        return executable.run(feeds)
    with lock:
        return executable.run(feeds)
