"""Cost model: per-node FLOPs and bytes from shape inference, per-backend speed, copy cost.

Estimated seconds of a node on a backend follow a roofline: the larger of
compute time (FLOPs / GFLOP/s) and memory time (bytes / GB/s), plus a
per-node launch overhead. A backend working outside host memory (OpenCL, even
on a CPU device) pays ``bytes / copy_gbps + copy_latency`` for every tensor
crossing a stage boundary; the host backend (``copy_gbps`` None) pays nothing.

Dynamic dimensions are bound to concrete sizes before shape inference: given
input shapes where the caller knows them, else axis 0 (batch) becomes 1 and
any other unknown axis ``DEFAULT_DIM``. Shapes that inference cannot tell are
measured by one run of the bound model on the host backend.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from backends.base import Backend, TensorSpec
from backends.onnx_graph import numpy_dtype_name, value_info_spec

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

DEFAULT_DIM = 64
"""Size assumed for an unknown non-batch input axis (a small image side, a short sequence)."""

# Ops that only relabel memory: no FLOPs, no traffic beyond a launch.
_VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size", "Dropout"})
_CONV_OPS = frozenset({"Conv", "ConvInteger", "QLinearConv", "ConvTranspose"})
# FLOPs per output element of elementwise ops costlier than one add.
_TRANSCENDENTAL = frozenset({"Exp", "Log", "Erf", "Tanh", "Sigmoid", "Pow", "Sqrt", "Gelu", "HardSwish",
                             "Softplus", "Sin", "Cos", "Reciprocal", "Div", "Elu", "Selu", "Mish"})
# FLOPs per input element of ops that read their input a few times (max, sum, exp, normalise).
_PER_INPUT = {"Softmax": 5, "LogSoftmax": 5, "LayerNormalization": 8, "InstanceNormalization": 8,
              "BatchNormalization": 2, "GlobalAveragePool": 1, "GlobalMaxPool": 1, "ReduceMean": 1,
              "ReduceSum": 1, "ReduceMax": 1, "ReduceMin": 1, "ReduceL2": 2, "ReduceProd": 1,
              "ArgMax": 1, "ArgMin": 1}


@dataclass(frozen=True)
class NodeCost:
    """Work of one node at the bound shapes: floating-point operations and bytes read + written.

    ``conv`` marks convolutions, which backends run at their own speed
    (``BackendSpeed.conv_gflops``): a naive OpenCL conv can be far slower than
    the same backend's matrix product.
    """

    flops: float
    mem_bytes: float
    conv: bool = False


@dataclass(frozen=True)
class BackendSpeed:
    """How fast a backend is, measured (``calibration``) or assumed.

    ``gflops`` is measured on a matrix product, ``conv_gflops`` on a 3x3
    convolution (None: same as ``gflops``). ``stage_us`` is the fixed cost of
    one ``Executable.run`` call (feeds handling, queue submit, sync);
    ``launch_us`` the cost of each node in it. ``copy_gbps`` None marks a
    backend that works in host memory.
    """

    backend: str
    gflops: float
    mem_gbps: float
    launch_us: float
    stage_us: float
    copy_gbps: float | None = None
    copy_latency_us: float = 0.0
    conv_gflops: float | None = None

    @property
    def on_host(self) -> bool:
        return self.copy_gbps is None

    def node_s(self, cost: NodeCost) -> float:
        gflops = self.conv_gflops if cost.conv and self.conv_gflops else self.gflops
        return max(cost.flops / (gflops * 1e9), cost.mem_bytes / (self.mem_gbps * 1e9)) + self.launch_us * 1e-6

    def copy_s(self, nbytes: float) -> float:
        """Seconds to move one tensor of ``nbytes`` between host and this backend's memory."""
        if self.copy_gbps is None:
            return 0.0
        return nbytes / (self.copy_gbps * 1e9) + self.copy_latency_us * 1e-6

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BackendSpeed":
        known = {k: data[k] for k in ("backend", "gflops", "mem_gbps", "launch_us", "stage_us",
                                      "copy_gbps", "copy_latency_us", "conv_gflops") if k in data}
        speed = cls(**known)
        if not (speed.gflops > 0 and speed.mem_gbps > 0 and speed.launch_us >= 0 and speed.stage_us >= 0
                and (speed.conv_gflops is None or speed.conv_gflops > 0)):
            raise ValueError(f"implausible speed for {speed.backend!r}: {speed}")
        return speed


def bound_input_shapes(inputs: Sequence[TensorSpec], known: Mapping[str, Sequence[int]] | None = None,
                       default_dim: int = DEFAULT_DIM) -> dict[str, tuple[int, ...]]:
    """Concrete shape of every input: ``known`` where given, else symbolic dims bound.

    A symbolic name shared by several inputs binds to one size; axis 0 binds
    to 1 (batch), other unknown axes to ``default_dim``.
    """
    known = dict(known or {})
    names: dict[str, int] = {}
    for spec in inputs:
        if spec.name in known:
            for dim, size in zip(spec.shape, known[spec.name]):
                if isinstance(dim, str):
                    names.setdefault(dim, int(size))
    shapes = {}
    for spec in inputs:
        if spec.name in known:
            shapes[spec.name] = tuple(int(d) for d in known[spec.name])
            continue
        dims = []
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, int) and dim >= 0:
                dims.append(dim)
                continue
            default = 1 if axis == 0 else default_dim
            dims.append(names.setdefault(dim, default) if isinstance(dim, str) and dim != "?" else default)
        shapes[spec.name] = tuple(dims)
    return shapes


def bound_tensor_specs(model: "onnx.ModelProto", shapes: Mapping[str, Sequence[int]],
                       probe: "Backend | None" = None) -> dict[str, TensorSpec]:
    """Specs of every tensor whose shape is known with the inputs fixed to ``shapes``.

    onnx shape inference first. Where it loses track (a Reshape to a computed
    shape, common in exported transformers) and a ``probe`` backend is given,
    the bound model runs once on it with those tensors exposed, and their real
    shapes fill the gaps. Tensors still unknown are left out.
    """
    import onnx

    from edge_runtime.planning.graph import infer_shapes

    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    for value in bound.graph.input:
        if value.name in shapes:
            for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name]):
                dim.Clear()
                dim.dim_value = int(size)
    # Stale symbolic shapes from the exporter would win over the bound ones.
    del bound.graph.value_info[:]
    for value in bound.graph.output:
        value.type.tensor_type.ClearField("shape")
    bound = infer_shapes(bound)
    specs = _known_specs(bound)
    gaps = [o for node in bound.graph.node for o in node.output if o and not (o in specs and specs[o].is_static())]
    if gaps and probe is not None:
        specs.update(_probed_specs(bound, gaps, probe))
    for init in bound.graph.initializer:
        specs[init.name] = TensorSpec(init.name, numpy_dtype_name(init.data_type), tuple(int(d) for d in init.dims))
    return specs


def _probed_specs(bound: "onnx.ModelProto", names: list[str], probe: "Backend") -> dict[str, TensorSpec]:
    """Real shapes of ``names`` from one run of the bound model on ``probe`` (empty on failure)."""
    import numpy as np
    import onnx
    from onnx import helper

    from backends.base import CompileOptions
    from backends.onnx_graph import graph_inputs

    exposed = onnx.ModelProto()
    exposed.CopyFrom(bound)
    typed = {vi.name: vi.type.tensor_type.elem_type for vi in exposed.graph.value_info}
    present = {o.name for o in exposed.graph.output}
    for name in names:
        if name not in present:
            exposed.graph.output.append(helper.make_tensor_value_info(name, typed.get(name, 0), None))
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in graph_inputs(exposed):
        dims = [d if isinstance(d, int) and d >= 0 else 1 for d in spec.shape]
        dtype = np.dtype(spec.dtype) if not spec.dtype.startswith("onnx:") else np.dtype("float32")
        feeds[spec.name] = rng.random(dims).astype(dtype) if dtype.kind == "f" else np.zeros(dims, dtype)
    try:
        executable = probe.compile(exposed, CompileOptions())
        try:
            values = executable.run(feeds)
        finally:
            executable.close()
    except Exception as exc:  # estimates stay rough; planning must not fail over them
        log.info("shape probe on %s failed (%s); %d tensor(s) keep unknown sizes", probe.name, exc, len(names))
        return {}
    return {name: TensorSpec(name, values[name].dtype.name, tuple(values[name].shape)) for name in names
            if name in values}


def _known_specs(model: "onnx.ModelProto") -> dict[str, TensorSpec]:
    """Specs of graph values that carry a shape (a missing shape means unknown rank, not a scalar)."""
    graph = model.graph
    return {vi.name: value_info_spec(vi) for vi in (*graph.input, *graph.value_info, *graph.output)
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")}


def tensor_bytes(spec: TensorSpec | None) -> int | None:
    """Bytes of a tensor with a fully known shape, else None."""
    if spec is None or not spec.is_static() or spec.dtype.startswith("onnx:"):
        return None
    import numpy as np

    return math.prod(spec.shape) * np.dtype(spec.dtype).itemsize


def node_cost(node: "onnx.NodeProto", specs: Mapping[str, TensorSpec]) -> NodeCost:
    """FLOPs and bytes of ``node`` at the shapes in ``specs``; unknown shapes count as one element."""
    in_specs = [specs.get(name) for name in node.input if name]
    out_specs = [specs.get(name) for name in node.output if name]
    if node.op_type in _VIEW_OPS:
        return NodeCost(0.0, 0.0)
    mem = float(sum(tensor_bytes(s) or 4 for s in (*in_specs, *out_specs)))
    out_elems = float(sum(_elements(s) for s in out_specs))
    in_elems = _elements(in_specs[0]) if in_specs else 1.0
    op = node.op_type
    if op in ("Conv", "ConvInteger", "QLinearConv"):
        weight = specs.get(node.input[1 if op != "QLinearConv" else 3])
        per_out = math.prod(weight.shape[1:]) if weight is not None and weight.is_static() else 9
        flops = 2.0 * out_elems * per_out
    elif op == "ConvTranspose":
        weight = specs.get(node.input[1])
        per_in = math.prod(weight.shape[1:]) if weight is not None and weight.is_static() else 9
        flops = 2.0 * in_elems * per_in
    elif op in ("MatMul", "MatMulInteger", "QLinearMatMul", "Gemm"):
        flops = 2.0 * out_elems * _inner_dim(node, in_specs)
    elif op in ("MaxPool", "AveragePool", "LpPool"):
        kernel = next((list(a.ints) for a in node.attribute if a.name == "kernel_shape"), [1])
        flops = out_elems * math.prod(kernel)
    elif op in _PER_INPUT:
        flops = in_elems * _PER_INPUT[op]
    elif op == "Resize":
        flops = out_elems * 4
    elif op in _TRANSCENDENTAL:
        flops = out_elems * 4
    else:
        flops = out_elems
    return NodeCost(flops, mem, conv=op in _CONV_OPS)


def _elements(spec: TensorSpec | None) -> float:
    if spec is None or not spec.is_static():
        return 1.0
    return float(math.prod(spec.shape))


def _inner_dim(node: "onnx.NodeProto", in_specs: list[TensorSpec | None]) -> int:
    """The reduced (K) dimension of a MatMul/Gemm, honouring Gemm's transA."""
    first = in_specs[0] if in_specs else None
    if first is None or not first.is_static() or not first.shape:
        return 1
    trans_a = any(a.name == "transA" and a.i for a in node.attribute)
    if node.op_type == "Gemm" and trans_a:
        return int(first.shape[0])
    return int(first.shape[-1])
