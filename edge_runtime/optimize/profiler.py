"""Per-op profile of a model on one plan: each node (or fused kernel) with its time on the backend that ran it.

The plan runs stage by stage on seeded inputs. A ``cpu`` stage is timed by
ONNX Runtime's profiler (``backends.ort_profile``); a stage whose executable
has the optional ``profile(feeds, repeats)`` hook (OpenCL: event profiling
per kernel) reports its kernels; any other stage (LiteRT, whose Python API
has no op profiler) is one row with its wall time. Rows come slowest first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_runtime.errors import InvalidInputError

if TYPE_CHECKING:
    from edge_runtime.runtime import Runtime


@dataclass(frozen=True)
class OpTime:
    """One node or kernel: where it ran, how it was measured, mean µs per run."""

    stage: int
    backend: str
    node: str
    op_type: str
    time_us: float
    source: str  # "onnxruntime-profiler", "opencl-events", "wall"

    def to_dict(self, total_us: float) -> dict[str, Any]:
        return {"stage": self.stage, "backend": self.backend, "node": self.node, "op_type": self.op_type,
                "time_us": self.time_us, "share": round(self.time_us / total_us, 4) if total_us else 0.0,
                "source": self.source}


@dataclass(frozen=True)
class ModelProfile:
    model: str
    plan: str
    stages: tuple[dict[str, Any], ...]  # stage, backend, wall_us
    ops: tuple[OpTime, ...]

    @property
    def total_us(self) -> float:
        return sum(op.time_us for op in self.ops)

    def to_dict(self) -> dict[str, Any]:
        total = self.total_us
        return {"model": self.model, "plan": self.plan, "total_op_us": round(total, 2),
                "stages": list(self.stages), "ops": [op.to_dict(total) for op in self.ops]}


def profile_model(runtime: "Runtime", path: Path, plan: str, *, repeat: int = 10) -> ModelProfile:
    """Load ``path`` on ``plan`` (ONNX) and profile it; raises what ``Runtime.load`` raises."""
    from edge_runtime.feeds import random_feeds
    from edge_runtime.planning.executor import PlanExecutor

    if Path(path).suffix.lower() != ".onnx":
        raise InvalidInputError(f"profile: {path}: expected an ONNX model (.onnx)")
    model = runtime.load(path, plan=plan)
    try:
        executor = model.executable
        assert isinstance(executor, PlanExecutor), "a plan load gives a PlanExecutor"
        env = dict(random_feeds(model.inputs))
        stages, ops = [], []
        for k, stage in enumerate(executor.stages):
            feeds = {t: env[t] for t in stage.spec.inputs}
            started = time.perf_counter()
            executor.advance(k, env, [])
            stages.append({"stage": k, "backend": stage.backend,
                           "wall_us": round((time.perf_counter() - started) * 1e6, 1)})
            ops.extend(_stage_ops(k, stage, feeds, repeat, runtime.threads))
    finally:
        model.close()
    ops.sort(key=lambda op: op.time_us, reverse=True)
    return ModelProfile(str(path), plan, tuple(stages), tuple(ops))


def _stage_ops(k: int, stage: Any, feeds: dict[str, Any], repeat: int, threads: int) -> list[OpTime]:
    hook = getattr(stage.executable, "profile", None)
    if stage.backend == "cpu" and stage.model is not None:
        from backends.ort_profile import profile_nodes

        rows = profile_nodes(stage.model, feeds, repeats=repeat, intra_op_threads=threads)
        return [OpTime(k, "cpu", r["node"], r["op_type"], r["mean_us"], "onnxruntime-profiler") for r in rows]
    if callable(hook):
        rows = hook(feeds, repeat)
        return [OpTime(k, stage.backend, r["label"], r["kernel"], r["best_us"], "opencl-events") for r in rows]
    started = time.perf_counter()
    for _ in range(repeat):
        stage.executable.run(feeds)
    mean_us = (time.perf_counter() - started) / repeat * 1e6
    return [OpTime(k, stage.backend, f"stage{k}", "(whole stage)", round(mean_us, 2), "wall")]


def format_profile(profile: ModelProfile, top: int) -> str:
    """A text table of the ``top`` slowest ops."""
    data = profile.to_dict()
    lines = [f"{data['model']} on plan {data['plan']}: {data['total_op_us']:.1f} µs in ops per run"]
    for stage in data["stages"]:
        lines.append(f"  stage {stage['stage']} on {stage['backend']}: {stage['wall_us']:.1f} µs wall (first run)")
    lines.append(f"  {'time µs':>10} {'share':>6}  {'backend':<8} {'op':<22} node")
    for op in data["ops"][:top]:
        lines.append(f"  {op['time_us']:>10.1f} {op['share']:>6.1%}  {op['backend']:<8} {op['op_type'][:22]:<22} "
                     f"{op['node']}")
    return "\n".join(lines)
