"""Choosing among a kernel's tile / work-group candidates by measuring them once.

Results are cached in memory and, with a cache directory, in
``cache_dir/opencl/tuning.json`` keyed on the device identity (name, driver),
the caller's fingerprint, the kernel family's source hash and the step's
shape key. A cached choice is reused without running anything.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path

from backends.opencl.builder import ProgramBuilder
from backends.opencl.cl_errors import backend_error
from backends.opencl.plan import KernelStep, Program
from backends.opencl.source import Instance, family_digest
from backends.opencl.stats import CompileStats


log = logging.getLogger(__name__)

_TIMED_RUNS = 5
_memory: dict[tuple[str, str], int] = {}  # (cache file or '', key) -> choice
_memory_lock = threading.Lock()


class Tuner:
    """Picks a variant index per step; measures only steps worth it and not yet cached."""

    def __init__(self, builder: ProgramBuilder, cache_root: Path | None, *, enabled: bool,
                 min_flops: float, stats: CompileStats, options: str) -> None:
        self.builder = builder
        self.path = cache_root / "tuning.json" if cache_root is not None else None
        self.enabled = enabled
        self.min_flops = min_flops
        self.stats = stats
        self.options = options
        self._file_lock = threading.Lock()

    def key(self, step: KernelStep) -> str:
        text = "|".join([self.builder.handle.info.cache_identity, self.builder.key_extra,
                         self.options, f"{step.family}.{step.entry}", family_digest(step.family),
                         step.tune_key, str(len(step.variants))])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def tunable(self, step: KernelStep) -> bool:
        """Whether ``step`` picks among its candidates (else its first, heuristic, variant)."""
        return self.enabled and len(step.variants) > 1 and step.flops >= self.min_flops

    def instances(self, program: Program) -> list[Instance]:
        """Every instance a specialisation may use: all candidates of tunable steps.

        Built as one program whether or not the choices are cached, so the
        program (and its cached binary) is the same on the first and later runs.
        """
        out = []
        for step in program.steps:
            variants = step.variants if self.tunable(step) else step.variants[:1]
            out += [Instance(step.family, v.entry or step.entry, v.defines) for v in variants]
        return out

    def choose(self, program: Program) -> list[int]:
        """Chosen variant index for each step of ``program``."""
        choices = [0] * len(program.steps)
        pending: list[int] = []
        disk = self._load()
        for index, step in enumerate(program.steps):
            if not self.tunable(step):
                continue
            key = self.key(step)
            with _memory_lock:
                known = _memory.get((str(self.path or ""), key))
            if known is None and key in disk:
                known = int(disk[key]["choice"])
            if known is not None and 0 <= known < len(step.variants):
                choices[index] = known
                self.stats.add(tuning_hits=1)
            else:
                pending.append(index)
        if pending:
            measured = self._measure(program, pending)
            for index, (choice, times_us) in measured.items():
                choices[index] = choice
                step = program.steps[index]
                key = self.key(step)
                with _memory_lock:
                    _memory[(str(self.path or ""), key)] = choice
                disk[key] = {"choice": choice, "times_us": times_us, "shape": step.tune_key}
            self._save(disk)
        return choices

    def _measure(self, program: Program, pending: list[int]) -> dict[int, tuple[int, list[float]]]:
        import numpy as np
        import pyopencl as cl

        handle = self.builder.handle
        instances: list[Instance] = []
        for index in pending:
            step = program.steps[index]
            instances += [Instance(step.family, v.entry or step.entry, v.defines) for v in step.variants]
        # Normally already in the kernel library (see instances()): no build here.
        kernels = iter(self.builder.kernels(instances, self.options, "tuning candidates"))
        queue = handle.new_queue(profiling=True)
        elem_bytes = 2 if "USE_HALF" in self.options else 4
        results: dict[int, tuple[int, list[float]]] = {}
        for index in pending:
            step = program.steps[index]
            sizes = [program.storages[program.tensors[a].sid].elems * elem_bytes for a in step.args]
            buffers = []
            for nbytes in sizes:
                buf = cl.Buffer(handle.context, cl.mem_flags.READ_WRITE, max(nbytes, 4))
                cl.enqueue_fill_buffer(queue, buf, np.zeros(1, np.float32), 0, max(nbytes, 4) // 4 * 4)
                buffers.append(buf)
            times = []
            for variant in step.variants:
                built, name = next(kernels)
                try:
                    kernel = cl.Kernel(built, name)
                    kernel.set_args(*buffers)
                    cl.enqueue_nd_range_kernel(queue, kernel, variant.global_size, variant.local_size).wait()
                    best = float("inf")
                    for _ in range(_TIMED_RUNS):
                        event = cl.enqueue_nd_range_kernel(queue, kernel, variant.global_size, variant.local_size)
                        event.wait()
                        best = min(best, (event.profile.end - event.profile.start) / 1e3)
                except cl.Error as exc:  # a candidate the device refuses simply loses
                    log.debug("opencl: tuning candidate %s of %s failed: %s", name, step.label,
                              backend_error(exc, device=handle.info.name, action="tune", kernel=name))
                    best = float("inf")
                times.append(best)
            if all(t == float("inf") for t in times):
                raise backend_error(RuntimeError("every candidate failed"), device=handle.info.name,
                                    action="tune", kernel=step.label, shape=step.shape)
            results[index] = (times.index(min(times)), [round(t, 2) for t in times])
            self.stats.add(tuning_measured=1)
            log.debug("opencl: tuned %s: %s", step.label, results[index])
        return results

    def _load(self) -> dict[str, dict]:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("opencl: ignoring unreadable tuning cache %s: %s", self.path, exc)
            return {}
        return {k: v for k, v in data.items() if isinstance(v, dict) and isinstance(v.get("choice"), int)} \
            if isinstance(data, dict) else {}

    def _save(self, data: dict[str, dict]) -> None:
        if self.path is None:
            return
        with self._file_lock:
            try:
                merged = self._load()
                merged.update(data)
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump(merged, handle, indent=1, sort_keys=True)
                os.replace(tmp, self.path)
            except OSError as exc:
                log.warning("opencl: cannot write tuning cache %s: %s", self.path, exc)
