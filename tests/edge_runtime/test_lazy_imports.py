"""``import edge_runtime`` must not import the heavy optional libraries (checked in a fresh process)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["pyopencl", "ai_edge_litert", "tflite_runtime", "aiohttp", "onnx", "onnxruntime", "tokenizers", "jinja2"]


def test_import_edge_runtime_imports_no_heavy_library() -> None:
    code = ("import sys, json, edge_runtime; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == []


def test_errors_are_importable_without_loading_the_runtime() -> None:
    code = ("import sys, edge_runtime; from edge_runtime import InvalidInputError, EdgeRuntimeError; "
            "assert issubclass(InvalidInputError, EdgeRuntimeError); "
            "print('edge_runtime.runtime' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
