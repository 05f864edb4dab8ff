"""One loaded ncnn network and how to run one sample through it.

ncnn has no batch axis: a network takes one sample (C, H, W) per input blob
and the backend loops over the batch. pnnx names blobs ``in0..`` and
``out0..`` in the ONNX graph's input and output order.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from backends.errors import BackendError, ModelLoadError

if TYPE_CHECKING:
    import ncnn

log = logging.getLogger(__name__)

_POWERSAVE_LOCK = threading.Lock()
_BIG_CORES = 2  # ncnn.set_cpu_powersave: 0 all cores, 1 little, 2 big


@dataclass(frozen=True)
class NetOptions:
    """How to run: threads, precision (``fp32``/``fp16``), Vulkan device index (None: CPU), spinning."""

    threads: int
    precision: str = "fp32"
    vulkan_device: int | None = None
    # OpenMP threads busy-wait between layers (ncnn's default, 20 ms); off where ONNX Runtime's
    # threads do not spin either (CompileOptions.allow_spinning: the scheduler's cpu worker).
    spin: bool = True


def cpu_threads(requested: int | None) -> int:
    """Threads for ncnn: the request (the runtime passes the profile's cgroup-aware usable cores),
    capped at the big cores where the SoC has big and little ones — after pinning to them."""
    import ncnn

    threads = requested or ncnn.get_physical_cpu_count() or 1
    big, little = ncnn.get_big_cpu_count(), ncnn.get_little_cpu_count()
    if big and little:
        # NOTE: process-wide in ncnn; on big.LITTLE phones a thread on a little core holds the
        # whole layer back, so ncnn's own big-core affinity is the better default.
        with _POWERSAVE_LOCK:
            if ncnn.get_cpu_powersave() != _BIG_CORES:
                ncnn.set_cpu_powersave(_BIG_CORES)
        threads = min(threads, big)
    return max(1, int(threads))


def load_net(param: Path, weights: Path, options: NetOptions) -> "ncnn.Net":
    """An ncnn.Net with fp32 (or configured fp16) options; raises ModelLoadError on a bad file."""
    import ncnn

    net = ncnn.Net()
    opt = net.opt
    fp16 = options.precision == "fp16"
    # NOTE: ncnn defaults to fp16 storage/arithmetic where the CPU has it (x86 F16C too): ~1e-3
    # error and no speed-up there. fp32 unless the user asked for fp16.
    opt.use_fp16_storage = opt.use_fp16_packed = opt.use_fp16_arithmetic = fp16
    opt.use_bf16_storage = False
    opt.num_threads = options.threads
    if not options.spin:
        # NOTE: both engines must agree. Sleeping ncnn threads beside spinning ORT threads wait for
        # the spinners' time slices (measured: the MLP 0.19 -> 72 ms); spinning ncnn threads beside
        # other load stall every layer barrier (PP-OCR rec 2-4x slower).
        opt.openmp_blocktime = 0
    if options.vulkan_device is not None:
        opt.use_vulkan_compute = True
        net.set_vulkan_device(options.vulkan_device)
    if net.load_param(str(param)) != 0 or net.load_model(str(weights)) != 0:
        raise ModelLoadError(f"ncnn cannot load {param} / {weights}")
    return net


def run_sample(net: "ncnn.Net", samples: Sequence[np.ndarray], output_count: int) -> list[np.ndarray]:
    """Outputs ``out0..`` of one sample given inputs ``in0..`` (float32, no batch axis)."""
    import ncnn

    kept = [np.ascontiguousarray(s, dtype=np.float32) for s in samples]  # Mat borrows this memory
    with net.create_extractor() as extractor:
        for i, sample in enumerate(kept):
            if extractor.input(f"in{i}", ncnn.Mat(sample)) != 0:
                raise BackendError(f"ncnn: input in{i} rejected (shape {sample.shape})")
        values = []
        for i in range(output_count):
            code, mat = extractor.extract(f"out{i}")
            if code != 0:
                raise BackendError(f"ncnn: extracting out{i} failed with code {code}")
            values.append(np.array(mat, dtype=np.float32))
    return values
