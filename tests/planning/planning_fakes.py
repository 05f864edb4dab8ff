"""Fakes and tiny models for planning tests.

``RefusingBackend`` wraps a real backend (the ``cpu`` backend, or OpenCL on
PoCL) and refuses chosen op types or node names, so tests decide where the
unclaimed islands are. Its executables can be told to fail or to sleep, to
test run-time fallback and pipelining. Models are built with ``onnx.helper``
from fixed seeds.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from backends.base import Availability, CompileOptions, ModelSource, TensorSpec
from backends.errors import BackendError, UnsupportedNodesError
from backends.onnx_graph import load_onnx, node_label, tensor_specs
from edge_runtime.planning.cost import BackendSpeed

# A host that is slow per node and an accelerator that is fast but pays for copies:
# the cost-driven plans then use the accelerator wherever it may.
HOST_SPEED = BackendSpeed("cpu", gflops=5.0, mem_gbps=5.0, launch_us=20.0, stage_us=20.0)


def accel_speed(name: str) -> BackendSpeed:
    return BackendSpeed(name, gflops=200.0, mem_gbps=100.0, launch_us=1.0, stage_us=5.0,
                        copy_gbps=100.0, copy_latency_us=1.0)


class RefusingBackend:
    """A real backend that refuses chosen ops/nodes; counts compiles; can inject failures."""

    def __init__(self, inner: Any, name: str, refuse_ops: tuple[str, ...] = (),
                 refuse_nodes: tuple[str, ...] = ()) -> None:
        self.inner = inner
        self.name = name
        self.refuse_ops = set(refuse_ops)
        self.refuse_nodes = set(refuse_nodes)
        self.compiled: list[InjectableExecutable] = []
        self.fail_runs = 0          # the next N runs of any executable raise BackendError
        self.raise_type: type[BaseException] = BackendError
        self.run_delay_s = 0.0

    def availability(self) -> Availability:
        return self.inner.availability()

    def supports(self, node: onnx.NodeProto, shapes: Mapping[str, TensorSpec]) -> bool:
        if node.op_type in self.refuse_ops or node.name in self.refuse_nodes:
            return False
        return self.inner.supports(node, shapes)

    def compile(self, model: ModelSource, options: CompileOptions) -> "InjectableExecutable":
        proto = load_onnx(model)
        specs = tensor_specs(proto)
        refused = [node_label(n, i) for i, n in enumerate(proto.graph.node) if not self.supports(n, specs)]
        if refused:  # like a real backend: never silently run what it does not claim
            raise UnsupportedNodesError(self.name, refused)
        executable = InjectableExecutable(self, self.inner.compile(proto, options), len(proto.graph.node))
        self.compiled.append(executable)
        return executable


class InjectableExecutable:
    """The inner executable, plus the owner's injected failures/delays and a record of its tensors."""

    def __init__(self, owner: RefusingBackend, inner: Any, node_count: int) -> None:
        self.owner = owner
        self.inner = inner
        self.inputs = inner.inputs
        self.outputs = inner.outputs
        self.backend_nodes = {owner.name: node_count}
        self.thread_safe = getattr(inner, "thread_safe", False)
        self.runs = 0
        self.seen_bytes: dict[str, int] = {}
        self._lock = threading.Lock()

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            self.runs += 1
            fail = self.owner.fail_runs > 0
            if fail:
                self.owner.fail_runs -= 1
        if self.owner.run_delay_s:
            time.sleep(self.owner.run_delay_s)
        if fail:
            raise self.owner.raise_type(f"{self.owner.name}: injected failure")
        outputs = self.inner.run(feeds)
        for name, array in (*feeds.items(), *outputs.items()):
            self.seen_bytes[name] = array.nbytes
        return outputs

    def close(self) -> None:
        self.inner.close()


# -- models ----------------------------------------------------------------------------
def _weight(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32),
                                   name)


def skip_dag(seed: int = 0) -> onnx.ModelProto:
    """A small CNN DAG with dynamic batch: skip connections, a side branch on the shared
    input, a Constant node, and two outputs (``logits`` and ``aux``)."""
    rng = np.random.default_rng(seed)
    inits = [_weight(rng, "w1", (8, 4, 3, 3)), _weight(rng, "w2", (8, 8, 3, 3)), _weight(rng, "w3", (8, 4, 1, 1)),
             _weight(rng, "wfc", (8, 5)), numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "bfc")]
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"], name="relu1"),
        n("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        n("Add", ["c2", "r1"], ["s"], name="skip_add"),
        n("Sigmoid", ["s"], ["g"], name="sigmoid"),
        n("Mul", ["g", "r1"], ["m"], name="gate_mul"),
        n("Conv", ["x", "w3"], ["a"], name="conv_aux"),
        n("Tanh", ["a"], ["t"], name="tanh_aux"),
        n("Mul", ["t", "c1"], ["aux"], name="aux_mul"),
        n("GlobalAveragePool", ["m"], ["p"], name="gap"),
        n("Flatten", ["p"], ["f"], name="flatten"),
        n("Constant", [], ["half"], name="half", value=numpy_helper.from_array(np.float32(0.5).reshape(1))),
        n("Mul", ["f", "half"], ["fh"], name="scale"),
        n("Gemm", ["fh", "wfc", "bfc"], ["logits"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes, "skip_dag", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5]),
         helper.make_tensor_value_info("aux", TensorProto.FLOAT, ["N", 8, 8, 8])], inits)
    return _finish(graph)


def chain(seed: int = 0, width: int = 256) -> onnx.ModelProto:
    """MatMul -> Relu -> MatMul -> Relu -> MatMul with dynamic batch: a plain chain."""
    rng = np.random.default_rng(seed)
    inits = [_weight(rng, f"w{i}", (width, width)) for i in range(3)]
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w0"], ["h0"], name="mm0"), n("Relu", ["h0"], ["r0"], name="relu0"),
             n("MatMul", ["r0", "w1"], ["h1"], name="mm1"), n("Relu", ["h1"], ["r1"], name="relu1"),
             n("MatMul", ["r1", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])], inits)
    return _finish(graph)


def random_dag(seed: int, size: int = 24) -> onnx.ModelProto:
    """A random DAG of Add/Mul/Relu/Sigmoid on [N, 6] tensors, two inputs; every dangling tensor is an output."""
    rng = np.random.default_rng(seed)
    available = ["x0", "x1"]
    consumed: set[str] = set()
    nodes = []
    for i in range(size):
        op = ["Add", "Mul", "Relu", "Sigmoid"][int(rng.integers(4))]
        arity = 2 if op in ("Add", "Mul") else 1
        # Mostly recent tensors, so the DAG is deep; now and then any earlier one: a long skip.
        picks = [available[max(0, len(available) - int(rng.geometric(0.4)))] if rng.random() < 0.8
                 else available[int(rng.integers(len(available)))] for _ in range(arity)]
        consumed.update(picks)
        nodes.append(helper.make_node(op, picks, [f"t{i}"], name=f"n{i}"))
        available.append(f"t{i}")
    outputs = [t for t in available[2:] if t not in consumed]
    graph = helper.make_graph(
        nodes, f"random_dag_{seed}", [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", 6]) for x in ("x0", "x1")],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, ["N", 6]) for t in outputs])
    return _finish(graph)


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="planning-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def feeds_for(model: onnx.ModelProto, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else batch for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def ort_outputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The oracle: a plain ONNX Runtime session on the whole model."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(feeds))))


def assert_close_to(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def ocr_models() -> dict[str, Path]:
    """PP-OCR det/cls/rec files shipped in the ``rapidocr-onnxruntime`` wheel (not imported), by kind."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return {}
    folder = Path(list(spec.submodule_search_locations)[0]) / "models"
    return {kind: path for path in folder.glob("*.onnx") for kind in ("det", "cls", "rec") if f"_{kind}_" in path.name}
