"""``ncnn`` and ``ncnn_vulkan``: Tencent's ncnn engine on the CPU, or on a Vulkan device.

Models are ONNX; the backend converts them with pnnx (``convert``), gates
each conversion against ONNX Runtime (``gate``) and runs them per shape
bucket (``executable``). fp32 unless ``CompileOptions.precision`` is
``"fp16"``. Threads come from ``CompileOptions.intra_op_threads`` (the
runtime passes the profile's cgroup-aware usable cores); on big.LITTLE CPUs
ncnn is pinned to the big cores.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from backends.base import Availability, CompileOptions, ModelSource, TensorSpec
from backends.errors import BackendUnavailableError, UnsupportedNodesError
from backends.ncnn.convert import pnnx_binary
from backends.ncnn.executable import NcnnExecutable
from backends.ncnn.net import NetOptions, cpu_threads
from backends.ncnn.ops import supports_node
from backends.onnx_graph import graph_inputs, graph_outputs, load_onnx, node_label, tensor_specs

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

CPU_DEVICE_TYPE = 3  # ncnn GpuInfo.type(): 0 discrete, 1 integrated, 2 virtual, 3 CPU (lavapipe, SwiftShader)


class NcnnBackend:
    """ncnn on the CPU; takes the CNN ops in ``ops.NCNN_OPS`` with float32 inputs."""

    name = "ncnn"
    vulkan = False

    def __init__(self, *, cache_dir: Path | None = None) -> None:
        self._cache_dir = cache_dir

    def availability(self) -> Availability:
        try:
            import ncnn
        except ImportError as exc:
            return Availability.no(f"ncnn is not importable (pip install ncnn): {exc}")
        converter = "pnnx converts" if pnnx_binary() else "no pnnx: only models converted elsewhere"
        if not self.vulkan:
            return Availability.yes(f"ncnn {ncnn.__version__} CPU", f"available; {converter}")
        index = vulkan_device_index()
        if index is None:
            return Availability.no("ncnn sees no Vulkan device (or was built without NCNN_VULKAN)")
        info = ncnn.get_gpu_info(index)
        kind = " [cpu, software]" if info.type() == CPU_DEVICE_TYPE else ""
        return Availability.yes(f"{info.device_name()}{kind} via ncnn {ncnn.__version__} Vulkan",
                                f"available; {converter}")

    def supports(self, node: "onnx.NodeProto", shapes: Mapping[str, TensorSpec]) -> bool:
        return supports_node(node, shapes)

    def compile(self, model: ModelSource, options: CompileOptions) -> NcnnExecutable:
        """Check the graph, then convert and gate now when the input shapes are static.

        Dynamic inputs convert on first sight of each shape (``executable``).
        Raises UnsupportedNodesError, BackendUnavailableError, ConversionError
        or ConversionRefusedError (both ModelLoadError).
        """
        proto = load_onnx(model)
        specs = tensor_specs(proto)
        refused = [node_label(n, i) for i, n in enumerate(proto.graph.node) if not supports_node(n, specs)]
        if refused:
            raise UnsupportedNodesError(self.name, refused)
        inputs, outputs = graph_inputs(proto), graph_outputs(proto)
        not_float = [f"{s.name} ({s.dtype})" for s in inputs if s.dtype != "float32"]
        if not_float or any(not s.shape for s in inputs):
            raise BackendUnavailableError(f"{self.name}: ncnn takes float32 inputs with a batch axis; "
                                          f"got {not_float or [s.to_dict() for s in inputs]}")
        # ncnn has no per-run stop (its OpenMP threads spin ~20 ms after each run): a policy that
        # wants spinning only within runs gets none.
        net_options = NetOptions(cpu_threads(options.intra_op_threads), options.precision,
                                 vulkan_device_index() if self.vulkan else None,
                                 options.allow_spinning and not options.spin_only_in_runs)
        cache_dir = options.cache_dir or self._cache_dir
        if cache_dir is None:  # conversion needs a disk folder even when caching is off
            cache_dir = Path(tempfile.mkdtemp(prefix="edge-runtime-ncnn-"))
        executable = NcnnExecutable(self.name, proto.SerializeToString(), inputs, outputs, net_options,
                                    Path(cache_dir))
        static = [s.shape[1:] for s in inputs]
        if all(isinstance(d, int) and d > 0 for dims in static for d in dims):
            executable.prepare(tuple(tuple(int(d) for d in dims) for dims in static))
        return executable


class NcnnVulkanBackend(NcnnBackend):
    """ncnn on its Vulkan device (a GPU on phones; lavapipe in tests and CI)."""

    name = "ncnn_vulkan"
    vulkan = True


def vulkan_device_index() -> int | None:
    """ncnn's Vulkan device: the first that is not a CPU-type one, else the first; None if none."""
    import ncnn

    try:
        count = ncnn.get_gpu_count()
    except (AttributeError, RuntimeError):  # a CPU-only build (the Android wheel) has no Vulkan
        return None
    if count <= 0:
        return None
    types = [ncnn.get_gpu_info(i).type() for i in range(count)]
    return next((i for i, t in enumerate(types) if t != CPU_DEVICE_TYPE), 0)
