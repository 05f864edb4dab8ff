"""The ``opencl`` backend: our own kernels through pyopencl.

Written for mobile GPUs (Adreno, Mali); verified on PoCL, the CPU OpenCL
driver. ``compile`` analyses the graph (what folds on the host, what runs on
the device, what fuses) and specialises it for static input shapes; models
with symbolic dims specialise on their first run per input signature (an LRU
of ``max_specialisations``). Graph inputs used only as parameters (a Resize's
scales, a Reshape's shape) are bound by value the same way.

Specialisation puts every size in the kernel source as ``#define`` lines, the
equivalent of ``-D`` options, but per kernel instance, so a whole graph
builds as one program (see ``source.py``).

Caches under ``cache_dir/opencl/``: ``canary.json`` (driver canary verdicts),
``binaries/`` (checksummed program binaries), ``tuning.json`` (tile and
work-group choices). fp16 (``precision="fp16"``) stores tensors in half and
computes in float; it needs ``cl_khr_fp16``.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from backends.base import Availability, CompileOptions, ModelSource, TensorSpec
from backends.errors import BackendUnavailableError, UnsupportedNodesError
from backends.onnx_graph import load_onnx
from backends.opencl.stats import CompileStats
from backends.opencl.support import claim

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from backends.opencl.builder import ProgramBuilder
    from backends.opencl.executable import OpenCLExecutable
    from backends.opencl.plan import Program
    from backends.opencl.tuning import Tuner

log = logging.getLogger(__name__)

CACHE_SUBDIR = "opencl"


class OpenCLBackend:
    """OpenCL kernels on the preferred device (GPU first, else any OpenCL device).

    ``cache_dir`` None keeps every cache (canary verdict, binaries, tuning) in
    memory only. ``tune`` measures tile/work-group candidates of kernels doing
    at least ``tune_min_flops``; ``max_specialisations`` bounds the per-model
    LRU of input signatures.
    """

    name = "opencl"

    def __init__(self, cache_dir: Path | None = None, *, canary_timeout_s: float = 60.0,
                 tune: bool = True, tune_min_flops: float = 5e6, max_specialisations: int = 4) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.canary_timeout_s = canary_timeout_s
        self.tune = tune
        self.tune_min_flops = tune_min_flops
        self.max_specialisations = max_specialisations
        self.stats = CompileStats()
        self._builders: dict[tuple[str, str], "ProgramBuilder"] = {}
        self._lock = threading.Lock()

    def _cache_root(self, cache_dir: Path | None) -> Path | None:
        root = cache_dir if cache_dir is not None else self.cache_dir
        return Path(root) / CACHE_SUBDIR if root is not None else None

    def availability(self) -> Availability:
        from backends.opencl.canary import check_device
        from backends.opencl.device import probe_device

        try:
            info = probe_device()
        except BackendUnavailableError as exc:
            return Availability.no(str(exc))
        verdict = check_device(info, self._cache_root(None), self.canary_timeout_s)
        if not verdict.ok:
            return Availability.no(f"opencl: device {info.name!r} (driver {info.driver_version}) "
                                   f"is marked unusable: {verdict.reason}")
        fp16 = ", fp16" if info.has_fp16 else ""
        return Availability.yes(info.name, f"{info.platform}, driver {info.driver_version}{fp16}")

    def own_memory(self) -> bool:
        """(optional hook, read by calibration) Whether the device has memory of its own (a discrete GPU),
        which it may read faster than the host reads its own. Raises BackendUnavailableError without one."""
        from backends.opencl.device import probe_device

        return not probe_device().host_unified

    def supports(self, node: "onnx.NodeProto", shapes: Mapping[str, TensorSpec]) -> bool:
        """Whether the kernels compute ``node`` (see backends.opencl.support)."""
        return claim(node, shapes) is None

    def claims(self, model: "onnx.ModelProto", shapes: Mapping[str, TensorSpec]) -> frozenset[int]:
        """(optional hook) Indices of the nodes compile() takes, judged on the whole graph.

        More than ``supports`` node by node: a node that folds at compile time
        (the Cos of rotary angles derived from a value-bound ``grid_thw``) is
        taken whatever its op, as it costs nothing at run time.
        """
        from backends.onnx_graph import node_label
        from backends.opencl.graph import analyse, unclaimed

        refused = unclaimed(analyse(model))
        return frozenset(i for i, node in enumerate(model.graph.node) if node_label(node, i) not in refused)

    def unclaimed_nodes(self, model: ModelSource) -> dict[str, str]:
        """Label -> reason for each node of ``model`` that compile() would refuse.

        The whole-graph form of ``supports``: it also knows which nodes fold at
        compile time (shape arithmetic) and which would need runtime values.
        Empty when the backend takes the whole model.
        """
        from backends.opencl.graph import analyse, unclaimed

        return unclaimed(analyse(load_onnx(model)))

    def _toolchain(self, options: CompileOptions) -> tuple["ProgramBuilder", "Tuner", bool]:
        """(builder, tuner, half) for ``options``; builders (and their kernel library) are shared."""
        from backends.opencl.builder import ProgramBuilder
        from backends.opencl.device import shared_device
        from backends.opencl.tuning import Tuner

        if options.precision not in ("fp32", "fp16"):
            raise BackendUnavailableError(f"opencl: unknown precision {options.precision!r} (fp32 or fp16)")
        available = self.availability()
        if not available.ok:
            raise BackendUnavailableError(available.reason)
        handle = shared_device()
        half = options.precision == "fp16"
        if half and not handle.info.has_fp16:
            raise BackendUnavailableError(
                f"opencl: device {handle.info.name!r} lacks cl_khr_fp16; precision='fp16' is unavailable")
        cache_root = self._cache_root(options.cache_dir)
        with self._lock:
            key = (str(cache_root or ""), options.cache_key_extra)
            builder = self._builders.get(key)
            if builder is None:
                builder = self._builders[key] = ProgramBuilder(handle, cache_root, options.cache_key_extra, self.stats)
        # -w: kernels branch on constant defines on purpose; PoCL would warn on every build.
        build_options = "-w -DUSE_HALF" if half else "-w"
        if handle.info.correct_divide:
            # OpenCL lets fp32 division be 2.5 ulp off; ONNX Runtime (the reference) divides IEEE-rounded.
            # One ulp decides a tie: on NVIDIA's driver Resize nearest picked the next pixel at exact
            # halves ((x + 0.5) / scale - 0.5 == 0.5) without this; PoCL divides correctly either way.
            build_options += " -cl-fp32-correctly-rounded-divide-sqrt"
        tuner = Tuner(builder, cache_root, enabled=self.tune, min_flops=self.tune_min_flops,
                      stats=self.stats, options=build_options)
        return builder, tuner, half

    def compile(self, model: ModelSource, options: CompileOptions) -> "OpenCLExecutable":
        """Compile ``model`` for the device.

        Raises UnsupportedNodesError listing every node the backend cannot take,
        BackendUnavailableError when the device is unusable (canary) or lacks
        cl_khr_fp16 for ``precision="fp16"``, BackendError on driver failures.
        """
        from backends.opencl.executable import OpenCLExecutable
        from backends.opencl.fusion import plan_groups
        from backends.opencl.graph import analyse, unclaimed
        from backends.opencl.runner import PreparedProgram

        proto = load_onnx(model)
        analysis = analyse(proto)
        problems = unclaimed(analysis)
        if problems:
            log.info("opencl: unclaimed nodes: %s", "; ".join(f"{k}: {v}" for k, v in problems.items()))
            error = UnsupportedNodesError("opencl", list(problems))
            error.reasons = problems  # type: ignore[attr-defined]
            raise error
        builder, tuner, half = self._toolchain(options)

        def make_runner(program: "Program", *, label: str, plan_s: float,
                        const_pool: dict[str, Any]) -> PreparedProgram:
            return PreparedProgram(program, builder, tuner, half=half, label=label, plan_s=plan_s,
                                   const_pool=const_pool)

        executable = OpenCLExecutable(
            analysis, plan_groups(analysis), make_runner, device_info=builder.handle.info,
            precision=options.precision, stats=self.stats,
            max_specialisations=self.max_specialisations, model_label=proto.graph.name or "model")
        if not analysis.is_dynamic():
            shapes = {spec.name: tuple(int(d) for d in spec.shape) for spec in analysis.inputs}
            executable.prepare(shapes, {}, at_compile=True)
        return executable

    def prebuild(self, jobs: Iterable[tuple[ModelSource, Mapping[str, "np.ndarray"]]],
                 options: CompileOptions) -> int:
        """Build the kernels of many (model, example feeds) pairs in one program build.

        Later compiles and runs of the same models and shapes find their kernels
        built. Models the backend refuses are skipped. Returns the number of
        kernels the batch needed.
        """
        import numpy as np

        from backends.opencl.compiler import SpecialisationError, specialise
        from backends.opencl.fusion import plan_groups
        from backends.opencl.graph import analyse, unclaimed

        builder, tuner, _ = self._toolchain(options)
        instances = []
        for model, feeds in jobs:
            analysis = analyse(load_onnx(model))
            if unclaimed(analysis):
                continue
            shapes = {s.name: tuple(np.asarray(feeds[s.name]).shape) for s in analysis.inputs
                      if s.name not in analysis.value_inputs}
            values = {n: np.asarray(feeds[n]) for n in analysis.value_inputs}
            try:
                program = specialise(analysis, plan_groups(analysis), shapes, values)
            except SpecialisationError as exc:
                log.debug("opencl: prebuild skips a model: %s", exc)
                continue
            instances += tuner.instances(program)
        if instances:
            builder.kernels(instances, tuner.options, "prebuild")
        return len(set(instances))
