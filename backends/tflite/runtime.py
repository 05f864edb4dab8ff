"""Which LiteRT interpreter module this process uses: ``ai_edge_litert``, else ``tflite_runtime``.

Imported lazily and once; nothing here imports LiteRT at module import time.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

from backends.errors import BackendUnavailableError

# Preference order: the maintained LiteRT wheel first, the legacy runtime after it.
_CANDIDATES = (("ai_edge_litert.interpreter", "ai_edge_litert"), ("tflite_runtime.interpreter", "tflite_runtime"))


@functools.lru_cache(maxsize=1)
def interpreter_module() -> ModuleType:
    """The interpreter module (``Interpreter``, ``load_delegate``, ``OpResolverType``).

    Raises BackendUnavailableError naming every module tried when none imports.
    """
    errors = []
    for module_name, _ in _CANDIDATES:
        try:
            return importlib.import_module(module_name)
        except ImportError as exc:
            errors.append(f"{module_name}: {exc}")
    raise BackendUnavailableError("no LiteRT interpreter importable (" + "; ".join(errors) + ")")


def runtime_description() -> str:
    """``"ai_edge_litert 2.3.0"``-style name and version of the module in use."""
    module = interpreter_module()
    for module_name, package in _CANDIDATES:
        if module.__name__ == module_name:
            version = getattr(importlib.import_module(package), "__version__", "unknown version")
            return f"{package} {version}"
    return module.__name__
