"""A backend that lies: its calibration claims 10x the host's speed while it runs 3x slower.

``SlowBackend`` wraps the ``cpu`` backend; each run sleeps twice the time its
inner run took, so it is 3x slower on any machine, however loaded. Tests give
the runtime ``lying_speed`` for it, so every estimate favours it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from backends.base import Availability, CompileOptions, ModelSource, TensorSpec
from edge_runtime.planning.cost import BackendSpeed

SLOWDOWN = 3.0


class SlowBackend:
    """The cpu backend under another name, ``SLOWDOWN`` times slower per run."""

    def __init__(self, name: str = "liar") -> None:
        from backends.cpu import CPUBackend

        self.name = name
        self.inner = CPUBackend()
        self.runs = 0

    def availability(self) -> Availability:
        return Availability.yes("a fake accelerator, 3x slower than it claims")

    def supports(self, node: Any, shapes: Mapping[str, TensorSpec]) -> bool:
        return self.inner.supports(node, shapes)

    def compile(self, model: ModelSource, options: CompileOptions) -> "SlowExecutable":
        return SlowExecutable(self, self.inner.compile(model, options))


class SlowExecutable:
    def __init__(self, owner: SlowBackend, inner: Any) -> None:
        self.owner = owner
        self.inner = inner
        self.inputs, self.outputs = inner.inputs, inner.outputs
        self.backend_nodes = {owner.name: sum(inner.backend_nodes.values())} if hasattr(inner, "backend_nodes") \
            else {owner.name: 0}
        self.thread_safe = True

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        outputs = self.inner.run(feeds)
        time.sleep((SLOWDOWN - 1.0) * (time.perf_counter() - start))
        self.owner.runs += 1
        return outputs

    def close(self) -> None:
        self.inner.close()


def lying_speed(host: BackendSpeed, name: str = "liar") -> BackendSpeed:
    """``host``'s calibrated speed, claimed 10x better, as a device next to the host (cheap copies)."""
    return replace(host, backend=name, gflops=host.gflops * 10, conv_gflops=(host.conv_gflops or host.gflops) * 10,
                   mem_gbps=host.mem_gbps * 10, launch_us=host.launch_us / 10, stage_us=host.stage_us / 10,
                   copy_gbps=host.mem_gbps * 10, copy_latency_us=0.1)


def lying_runtime(cache_dir: Any, monkeypatch: Any, name: str = "liar") -> tuple[Any, SlowBackend]:
    """A default-configured Runtime (real cpu calibration) with ``SlowBackend`` as its accelerator."""
    from edge_runtime.config import RuntimeConfig
    from edge_runtime.runtime import Runtime

    rt = Runtime(RuntimeConfig(cache_dir=cache_dir))
    slow = SlowBackend(name)
    host_speed = rt.backend_speed("cpu")  # measured here, not pinned
    monkeypatch.setitem(rt._backends, name, (slow, slow.availability()))
    monkeypatch.setattr(rt, "accelerator", lambda: name)
    real = rt.backend_speed
    monkeypatch.setattr(rt, "backend_speed", lambda n: lying_speed(host_speed, name) if n == name else real(n))
    return rt, slow
