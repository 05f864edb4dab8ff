"""One specialisation on the device: built kernels, planned buffers, and its run.

A run copies the feeds in, enqueues every kernel without waiting, enqueues
the output reads and waits once: tensors stay on the device from the first
node to the last.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from typing import Any, Mapping

import numpy as np

from backends.opencl.builder import ProgramBuilder
from backends.opencl.cl_errors import backend_error
from backends.opencl.memory import plan_memory
from backends.opencl.plan import Program, shape_text
from backends.opencl.source import Instance
from backends.opencl.tuning import Tuner


log = logging.getLogger(__name__)


class PreparedProgram:
    """Built and allocated; ``run`` is thread-safe (one run at a time)."""

    def __init__(self, program: Program, builder: ProgramBuilder, tuner: Tuner, *, half: bool,
                 label: str, plan_s: float, const_pool: dict[str, Any] | None = None) -> None:
        """Build (or find) the kernels, plan memory, upload constants.

        ``const_pool`` (content hash -> device buffer) lets the specialisations
        of one model share their weights instead of uploading them again.
        """
        import pyopencl as cl

        self.program = program
        self.handle = builder.handle
        self.half = half
        self.label = label
        self._dtype = np.float16 if half else np.float32
        self._lock = threading.Lock()
        device = self.handle.info.name
        started = time.perf_counter()
        if program.steps:
            builder.kernels(tuner.instances(program), tuner.options, label)
        built = time.perf_counter()
        choices = tuner.choose(program)
        chosen = [step.variants[choice] for step, choice in zip(program.steps, choices)]
        instances = [Instance(step.family, variant.entry or step.entry, variant.defines)
                     for step, variant in zip(program.steps, chosen)]
        kernels = builder.kernels(instances, tuner.options, label) if instances else []
        self.timings_s = {"plan": plan_s, "build": built - started, "tune": time.perf_counter() - built}
        self.memory = plan_memory(program)
        elem_bytes = 2 if half else 4
        self.queue = self.handle.new_queue()
        try:
            slots = [cl.Buffer(self.handle.context, cl.mem_flags.READ_WRITE, max(n, 1) * elem_bytes)
                     for n in self.memory.slot_elems]
            self._buffers: dict[int, "cl.Buffer"] = {sid: slots[k] for sid, k in self.memory.slot_of.items()}
            self.const_bytes = 0
            pool = const_pool if const_pool is not None else {}
            for storage in program.storages:
                if storage.kind == "const" and storage.host is not None:
                    host = np.ascontiguousarray(storage.host.reshape(-1), dtype=self._dtype)
                    if host.size == 0:
                        host = np.zeros(1, self._dtype)
                    key = hashlib.sha1(host.tobytes()).hexdigest() + host.dtype.str
                    if key not in pool:
                        pool[key] = cl.Buffer(self.handle.context,
                                              cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
                    self._buffers[storage.sid] = pool[key]
                    self.const_bytes += host.nbytes
            self._launches = []
            for step, choice, (built, name) in zip(program.steps, choices, kernels):
                kernel = cl.Kernel(built, name)
                kernel.set_args(*[self._buffers[program.tensors[a].sid] for a in step.args])
                variant = step.variants[choice]
                self._launches.append((kernel, variant.global_size, variant.local_size, step))
        except cl.Error as exc:
            raise backend_error(exc, device=device, action="allocate buffers / create kernels",
                                kernel=label) from exc
        self.kernel_families = Counter(f"{i.family}.{i.entry}" for i in instances)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import pyopencl as cl

        program = self.program
        keep_alive = []
        results: dict[str, np.ndarray] = {}
        with self._lock:
            step = None
            try:
                for name in program.inputs:
                    host = np.ascontiguousarray(feeds[name], dtype=self._dtype)
                    keep_alive.append(host)
                    if host.size:
                        cl.enqueue_copy(self.queue, self._buffers[program.tensors[name].sid], host,
                                        is_blocking=False)
                for kernel, global_size, local_size, step in self._launches:
                    cl.enqueue_nd_range_kernel(self.queue, kernel, global_size, local_size)
                step = None
                pending = []
                for name in program.outputs:
                    if name in program.host_outputs:
                        results[name] = np.array(program.host_outputs[name])
                        continue
                    ref = program.tensors[name]
                    host = np.empty(ref.shape, dtype=self._dtype)
                    if host.size:
                        cl.enqueue_copy(self.queue, host, self._buffers[ref.sid], is_blocking=False)
                    pending.append((name, host))
                self.queue.finish()
            except cl.Error as exc:
                kernel = step.label if step is not None else self.label
                shape = step.shape if step is not None else ""
                raise backend_error(exc, device=self.handle.info.name, action="run", kernel=kernel,
                                    shape=shape) from exc
        for name, host in pending:
            results[name] = host.astype(np.float32) if self.half else host
        return {name: results[name] for name in program.outputs}

    def profile(self, repeats: int = 5) -> list[dict[str, Any]]:
        """Per-step device time (best of ``repeats``, microseconds) on a profiling queue.

        Runs on the buffers as they are (the last run's data); for benchmarks.
        """
        import pyopencl as cl

        queue = self.handle.new_queue(profiling=True)
        rows = []
        with self._lock:
            try:
                for kernel, global_size, local_size, step in self._launches:
                    best = float("inf")
                    for _ in range(max(repeats, 1)):
                        event = cl.enqueue_nd_range_kernel(queue, kernel, global_size, local_size)
                        event.wait()
                        best = min(best, (event.profile.end - event.profile.start) / 1e3)
                    rows.append({"label": step.label, "kernel": f"{step.family}.{step.entry}",
                                 "shape": step.shape, "flops": step.flops, "best_us": round(best, 2)})
            except cl.Error as exc:
                raise backend_error(exc, device=self.handle.info.name, action="profile",
                                    kernel=self.label) from exc
        return rows

    def describe(self) -> dict[str, Any]:
        elem_bytes = 2 if self.half else 4
        planned, naive = self.memory.nbytes(elem_bytes)
        return {
            "kernels": len(self.program.steps),
            "kernel_families": dict(self.kernel_families),
            "fused": list(self.program.fused),
            "folded_nodes": self.program.folded_nodes,
            "buffer_bytes": {"planned": planned, "naive": naive, "buffers": len(self.memory.slot_elems)},
            "const_bytes": self.const_bytes,
            "times_s": {k: round(v, 4) for k, v in self.timings_s.items()},
            "inputs": {n: shape_text(self.program.tensors[n].shape) for n in self.program.inputs},
        }

