"""The official ONNX node test cases on the OpenCL backend (ONNX backend API).

Selection: every node test of an op we claim (non-expanded forms; expanded
forms re-test the same element-wise kernels through other ops), minus
variants the backend refuses up front (``OpenCLBackend.unclaimed_nodes``:
integer data, training mode, 3-D pooling, cubic resize...). Every selected
test must pass, except those in EXPECTED_FAILURES, the one list of known
failures with their reasons. A floor on the number of selected tests keeps
the filter from silently emptying the run.

Speed: all selected models' kernels are built up front in one program
(``OpenCLBackend.prebuild``); PoCL then only compiles each kernel's
work-group function on its first launch.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from backends.base import CompileOptions

pytestmark = pytest.mark.requires_opencl

# Test name (without the _cpu suffix) -> why it fails. Keep this the only such list.
EXPECTED_FAILURES: dict[str, str] = {}

_NOT_OURS = re.compile(r"_expanded|^test_training_|^test_optional_|^test_identity_(opt|sequence)")
MIN_SELECTED = 250
_SELECTED: dict[str, object] = {}


def _select() -> dict[str, object]:
    from onnx.backend.test.loader import load_model_tests

    from backends.opencl.onnx_backend import shared_backend

    backend = shared_backend()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators warn about their own overflows
        cases = load_model_tests(kind="node")
    return {c.name: c for c in cases if not _NOT_OURS.search(c.name) and not backend.unclaimed_nodes(c.model)}


def _build_cases() -> dict[str, type]:
    try:
        import pyopencl  # noqa: F401
        from onnx.backend.test import BackendTest

        from backends.opencl.onnx_backend import OpenCLOnnxBackend
    except ImportError:
        return {}
    _SELECTED.update(_select())
    runner = BackendTest(OpenCLOnnxBackend, __name__)
    for name in _SELECTED:
        runner.include(f"^{re.escape(name)}_cpu$")
    for name in EXPECTED_FAILURES:
        runner.xfail(f"^{re.escape(name)}_cpu$")
    cases = runner.test_cases
    wanted = {f"{name}_cpu" for name in _SELECTED}
    for case in cases.values():
        # Drop the generated methods of every other node test (they would only skip).
        for attr in [a for a in vars(case) if a.startswith("test_") and a not in wanted]:
            delattr(case, attr)
        case.pytestmark = [pytest.mark.requires_opencl]
    return cases


globals().update(_build_cases())


@pytest.fixture(scope="module", autouse=True)
def _prebuild_kernels() -> None:
    from backends.opencl.onnx_backend import shared_backend

    jobs = []
    for case in _SELECTED.values():
        inputs, _ = case.data_sets[0]
        names = [vi.name for vi in case.model.graph.input]
        jobs.append((case.model, {n: np.asarray(v) for n, v in zip(names, inputs)}))
    if jobs:
        shared_backend().prebuild(jobs, CompileOptions())


def test_selection_is_not_empty() -> None:
    assert len(_SELECTED) >= MIN_SELECTED, f"only {len(_SELECTED)} node tests selected"
    assert set(EXPECTED_FAILURES) <= set(_SELECTED)
