"""Give the C heap's free pages back to the system after a one-off burst of allocations.

Loading a model off the event loop (``scheduler/single_thread.py`` builds a second session in a
background thread) allocates in that thread's own glibc malloc arena: the ONNX graph, ORT's
optimisation passes, the prepacked weights. Most of it is freed when the load returns, but the
arena keeps its pages, and the daemon's idle RSS stays ~8 MiB higher for a 0.5 MB model
(measured on the PP-OCR classifier: +7-11 MiB without a trim, +3.3 MiB with one, which is
the session itself). The daemon's start is the same burst on the main thread: loading the
repository parses and optimises every graph. glibc's ``malloc_trim(0)`` returns the free pages
of every arena; Python has no binding for it, so it is called through ctypes. Other C libraries
(Android's bionic, musl) lack it and are left as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
    return trim


def release_free_heap() -> bool:
    """Return the C heap's free pages to the system where the C library can; whether it could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
