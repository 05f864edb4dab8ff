"""Flush-to-zero / denormals-are-zero on the threads that run a decoder (x86-64 Linux).

A decode step's attention multiplies each cached value by its softmax weight;
over a long context most weights are far below float32's normal range
(1.2e-38), and on Intel cores every arithmetic operation on such a subnormal
number takes a microcode assist of ~100 cycles. Measured here (the 31M fused
decoder, 2 threads, an Intel Xeon with AVX-512): a decode step at 1,024 tokens
of context took 8.3-9.2 ms with subnormals and 4.3-5.2 ms with them flushed, a
1,024-token prefill 800 against 295 ms, the same greedy tokens
(``tools/bench_denormals.py``, two runs). Inference engines commonly run
their compute threads this way (TensorFlow flushes denormals in its thread
pools); ONNX Runtime has the switch (``session.set_denormal_as_zero``) but
applies it to its own pool threads and, once per process, to the thread that
creates the first session — not to the thread that later calls ``run`` and
does part of the work itself. So the engine sets the session entry and runs
its loop inside :func:`flushed_denormals`, and creates its session inside
:func:`thread_mode_kept`, so that the caller's own thread (an application's
main thread, in the embedded API) keeps its mode.

The mode is per thread (MXCSR bits FTZ and DAZ) and threads inherit it from the
thread that creates them. No library exposes it to Python (numpy does not), so
it is set here through glibc's ``fegetenv``/``fesetenv``, whose x86-64
``fenv_t`` ends with the MXCSR word. Elsewhere (ARM, other C libraries) nothing
is changed and :func:`flushed_denormals` yields False.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import platform
import sys
from typing import Iterator

SESSION_ENTRY = "session.set_denormal_as_zero"  # ONNX Runtime's session config key
FTZ_DAZ = 0x8040  # MXCSR bit 15 (flush results to zero) and bit 6 (read subnormal inputs as zero)


class _FenvX8664(ctypes.Structure):
    # glibc's x86-64 fenv_t: the 28-byte x87 environment (fnstenv), then MXCSR (stmxcsr).
    _fields_ = [("x87", ctypes.c_uint8 * 28), ("mxcsr", ctypes.c_uint32)]


@functools.lru_cache(maxsize=1)
def _libm() -> ctypes.CDLL | None:
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    name = ctypes.util.find_library("m") or "libm.so.6"
    try:
        libm = ctypes.CDLL(name)
        libm.fegetenv.argtypes = libm.fesetenv.argtypes = [ctypes.POINTER(_FenvX8664)]
        libm.fegetenv.restype = libm.fesetenv.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    if ctypes.sizeof(_FenvX8664) != 32:  # not glibc's layout
        return None
    return libm


def supported() -> bool:
    """Whether this process can switch the mode (x86-64 Linux with glibc)."""
    return _libm() is not None


def _env(libm: ctypes.CDLL) -> _FenvX8664:
    env = _FenvX8664()
    if libm.fegetenv(ctypes.byref(env)) != 0:
        raise OSError("fegetenv failed")
    return env


def _set(libm: ctypes.CDLL, bits: int) -> None:
    """Set the FTZ/DAZ bits of this thread's MXCSR to ``bits``."""
    env = _env(libm)
    env.mxcsr = (env.mxcsr & ~FTZ_DAZ) | bits
    if libm.fesetenv(ctypes.byref(env)) != 0:
        raise OSError("fesetenv failed")


@contextlib.contextmanager
def thread_mode_kept() -> Iterator[None]:
    """Whatever the block does to this thread's FTZ/DAZ mode is undone after it."""
    libm = _libm()
    if libm is None:
        yield
        return
    before = _env(libm).mxcsr & FTZ_DAZ
    try:
        yield
    finally:
        _set(libm, before)


def thread_flushes() -> bool:
    """Whether this thread flushes subnormal floats now."""
    libm = _libm()
    return libm is not None and _env(libm).mxcsr & FTZ_DAZ == FTZ_DAZ


@contextlib.contextmanager
def flushed_denormals(enabled: bool = True) -> Iterator[bool]:
    """Run the block with subnormal floats flushed to zero on this thread (and on threads it starts
    meanwhile); the thread's previous mode comes back after. Yields whether the mode is on."""
    libm = _libm() if enabled else None
    if libm is None:
        yield False
        return
    with thread_mode_kept():
        _set(libm, FTZ_DAZ)
        yield True
