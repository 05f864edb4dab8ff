"""One op conformance suite for every backend: each case of ``op_cases`` against ONNX Runtime CPU.

(ggml's test-backend-ops idea.) A backend proves itself by adding one entry to
``BACKENDS``. A case whose nodes the backend does not all claim (``supports``)
is not compiled there: the test then checks that ``cpu`` claims the refused
nodes, so a partitioned plan can place them, and that the backend's claim is
stable. Everything claimed must match within 1e-4 relative.
"""

from __future__ import annotations

import numpy as np
import pytest

from backends.base import CompileOptions, backend_nodes_of
from backends.onnx_graph import tensor_specs
from tests.backends.model_helpers import assert_close, ort_outputs, reference_outputs
from tests.backends.op_cases import CASES, REFERENCE_ORACLE, case_inputs

BACKENDS = {
    "cpu": (None, lambda request: __import__("backends.cpu", fromlist=["CPUBackend"]).CPUBackend()),
    "opencl": (pytest.mark.requires_opencl, lambda request: request.getfixturevalue("ocl_backend")),
    "vulkan": (pytest.mark.requires_vulkan, lambda request: request.getfixturevalue("vk_backend")),
}
_PARAMS = [pytest.param(b, marks=[m] if m else []) for b, (m, _) in BACKENDS.items()]


@pytest.fixture(scope="module", params=_PARAMS)
def op_backend(request):
    backend = BACKENDS[request.param][1](request)
    if request.param == "opencl":  # one program build for every case's kernels (PoCL: ~0.3 s a build)
        backend.prebuild([case_inputs(name) for name in CASES], CompileOptions())
    return backend


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_onnxruntime(name: str, op_backend) -> None:
    model, feeds = case_inputs(name)
    specs = tensor_specs(model)
    refused = [n for n in model.graph.node if not op_backend.supports(n, specs)]
    if refused:
        from backends.cpu import CPUBackend

        assert all(CPUBackend().supports(n, specs) for n in refused)
        assert [n for n in model.graph.node if not op_backend.supports(n, specs)] == refused
        return
    executable = op_backend.compile(model, CompileOptions(intra_op_threads=1))
    got = executable.run(feeds)
    oracle = reference_outputs if name in REFERENCE_ORACLE else ort_outputs
    want = oracle(model, feeds)
    assert [o.name for o in model.graph.output] == list(got)
    for output, expected in zip(model.graph.output, want):
        if expected.dtype == np.bool_:
            np.testing.assert_array_equal(got[output.name], expected)
        else:
            assert_close(got[output.name], expected, what=f"{name}:{output.name}")
    counts = backend_nodes_of(executable, op_backend.name, len(model.graph.node))
    assert sum(counts.values()) == len(model.graph.node) and op_backend.name in counts
    if op_backend.name == "opencl":
        assert counts == {"opencl": len(model.graph.node)}
    executable.close()
