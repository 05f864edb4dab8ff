"""Building programs: from the binary cache when possible, from source otherwise.

Every failure becomes a BackendError naming the device and what was being
built; a cached binary the driver refuses is deleted and rebuilt.

The builder also keeps a kernel library in memory: every built instance
(family, entry, defines) maps to its program, so a kernel already built for
another model, specialisation or tuning run is never built again, and a
batch of models can be built with one ``clBuildProgram`` (see ``kernels``).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from backends.opencl.binary_cache import BinaryCache, binary_key
from backends.opencl.cl_errors import backend_error
from backends.opencl.device import DeviceHandle
from backends.opencl.source import Instance, assemble, kernel_name
from backends.opencl.stats import CompileStats

if TYPE_CHECKING:
    import pyopencl as cl

log = logging.getLogger(__name__)


class ProgramBuilder:
    """Builds assembled sources on one device, with an optional disk cache."""

    def __init__(self, handle: DeviceHandle, cache_root: Path | None, key_extra: str,
                 stats: CompileStats, max_instances: int = 4096) -> None:
        self.handle = handle
        self.cache = BinaryCache(cache_root) if cache_root is not None else None
        self.key_extra = key_extra
        self.stats = stats
        self.max_instances = max_instances
        self._library: dict[tuple[Instance, str], tuple["cl.Program", str]] = {}
        self._lock = threading.Lock()

    def kernels(self, instances: list[Instance], options: str, what: str) -> list[tuple["cl.Program", str]]:
        """(program, kernel name) per instance; the ones not built yet share one build."""
        with self._lock:
            missing = list(dict.fromkeys(i for i in instances if (i, options) not in self._library))
            if missing:
                program = self.build(assemble(missing), options, f"{what} ({len(missing)} kernels)")
                for kid, inst in enumerate(missing):
                    self._library[(inst, options)] = (program, kernel_name(inst.entry, kid))
            found = [self._library[(i, options)] for i in instances]
            while len(self._library) > self.max_instances:  # oldest first; live kernels keep their program
                del self._library[next(iter(self._library))]
            return found

    def build(self, source: str, options: str, what: str) -> "cl.Program":
        """A built program for ``source``; ``what`` names it in errors ("model x, 12 kernels")."""
        import pyopencl as cl

        key = binary_key(self.handle.info.cache_identity, self.key_extra, source, options)
        if self.cache is not None:
            payload, rejected = self.cache.load(key)
            if rejected:
                self.stats.add(binary_rejected=1)
            if payload is not None:
                try:
                    program = cl.Program(self.handle.context, [self.handle.device], [payload])
                    program.build(options=options)
                    self.stats.add(binary_hits=1)
                    return program
                except cl.Error as exc:
                    log.warning("opencl: driver refused cached binary %s (%s); rebuilding", key, exc)
                    self.stats.add(binary_rejected=1)
                    self.cache.discard(key)
        started = time.perf_counter()
        try:
            program = cl.Program(self.handle.context, source).build(options=options)
        except cl.Error as exc:
            raise backend_error(exc, device=self.handle.info.name, action="build program",
                                kernel=what) from exc
        self.stats.add(program_builds=1)
        log.debug("opencl: built %s in %.3f s", what, time.perf_counter() - started)
        if self.cache is not None:
            try:
                binaries = program.get_info(cl.program_info.BINARIES)
            except cl.Error as exc:
                log.warning("opencl: cannot read program binary for the cache: %s", exc)
            else:
                if binaries and binaries[0]:
                    self.cache.store(key, bytes(binaries[0]))
        return program
