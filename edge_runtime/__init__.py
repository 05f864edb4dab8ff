"""edge-runtime: fast, load-aware inference on ARM/Android cloud phones and edge devices.

``import edge_runtime`` is cheap: it imports no ML or GPU library. ``Runtime``
and ``Model`` are loaded on first use.

    from edge_runtime import Runtime
    rt = Runtime()
    model = rt.load("model.onnx")          # backend="auto": best available backend
    outputs = model.run({"input": array})
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edge_runtime.errors import *  # noqa: F403 - the error family is part of the public API
from edge_runtime.errors import __all__ as _error_names

__version__ = "0.1.0"

if TYPE_CHECKING:
    from edge_runtime.model import Model
    from edge_runtime.runtime import Runtime

_LAZY = {"Runtime": "edge_runtime.runtime", "Model": "edge_runtime.model"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'edge_runtime' has no attribute {name!r}")


__all__ = ["Runtime", "Model", "__version__", *_error_names]
