"""Shared helpers for scheduler tests: real executables behind instrumented plans.

Every plan here runs a real executable (an ONNX Runtime session through the
``cpu`` backend, or the ``null`` backend for pure-decision tests); the
wrapper only records what it ran, holds runs at a gate, slows them, or fails
them like a broken device. A plan labelled ``device="gpu"`` is a *stand-in*:
a second ONNX Runtime session placed on the gpu worker, since no GPU backend
exists on the test machine.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Mapping

import numpy as np

from backends.base import CompileOptions
from backends.errors import BackendError


def compile_on(backend: str, proto: Any, threads: int = 1) -> Any:
    """A real executable of ``proto`` on the ``cpu`` (ONNX Runtime) or ``null`` backend."""
    if backend == "cpu":
        from backends.cpu import CPUBackend

        return CPUBackend().compile(proto, CompileOptions(intra_op_threads=threads))
    from backends.null import NullBackend

    return NullBackend().compile(proto, CompileOptions())


def ort_oracle(proto: Any) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
    """Plain ONNX Runtime, independent of our backends: the reference for every output."""
    import onnxruntime as ort

    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(names, dict(feeds))))


def pool_model(plan: Any) -> Any:
    """The loaded ``Model`` whose pool session a factory-built cpu plan runs on (under its
    one-thread switch, ``scheduler/single_thread.py``, when it has one)."""
    call = plan.call
    return getattr(call, "pool", call).__self__


def assert_like_ort(proto: Any, feeds: list[Mapping[str, np.ndarray]], results: list[Any], output: str,
                    rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Each result's ``output`` equals plain ONNX Runtime's on its own feeds (``ort_oracle``)."""
    oracle = ort_oracle(proto)
    for feed, result in zip(feeds, results, strict=True):
        np.testing.assert_allclose(result.outputs[output], oracle(feed)[output], rtol=rtol, atol=atol)


class InstrumentedPlan:
    """A plan over a real executable that records its feeds; optionally gated, slowed or failing."""

    def __init__(self, name: str, executable: Any, backends: tuple[str, ...] = ("cpu",), device: str = "",
                 delay_s: float = 0.0, fail: bool = False, estimated_ms: float | None = None) -> None:
        self.name = name
        self.backends = backends
        self.device = device
        self.estimated_ms = estimated_ms
        self.executable = executable
        self.delay_s = delay_s
        self.fail = fail
        self.calls: list[dict[str, np.ndarray]] = []
        self.threads: list[int] = []  # the thread of each run (the loop's for an inlined one)
        self.gate = threading.Event()
        self.gate.set()
        self.barrier: threading.Barrier | None = None
        self._lock = threading.Lock()
        self.active = 0
        self.max_active = 0

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            assert self.gate.wait(timeout=20), "test gate never opened"
            if self.barrier is not None:
                self.barrier.wait(timeout=5)
            if self.delay_s:
                time.sleep(self.delay_s)
            self.calls.append({k: v.copy() for k, v in feeds.items()})
            self.threads.append(threading.get_ident())
            if self.fail:
                raise BackendError(f"{self.name}: device lost (simulated driver failure)")
            return self.executable.run(feeds)
        finally:
            with self._lock:
                self.active -= 1


async def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``condition`` on the event loop until true; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.002)


def ran(plan: InstrumentedPlan, name: str, array: np.ndarray) -> bool:
    """Whether any run of ``plan`` saw ``array`` (as a whole input or among its rows)."""
    for feeds in plan.calls:
        batch = feeds[name]
        if batch.shape[1:] == array.shape[1:]:
            for start in range(0, batch.shape[0] - array.shape[0] + 1):
                if np.array_equal(batch[start:start + array.shape[0]], array):
                    return True
    return False


async def hold_worker(sched: Any, plan: InstrumentedPlan, feeds: Mapping[str, np.ndarray],
                      **infer_options: Any) -> "asyncio.Task":
    """Close ``plan``'s gate and start one request that waits inside it, so later requests must queue.

    Open ``plan.gate`` to let it (and everything queued behind it) run; await the returned task.
    """
    plan.gate.clear()
    task = asyncio.create_task(sched.infer(feeds, **infer_options))
    await wait_until(lambda: sched.in_flight == 1)
    return task
