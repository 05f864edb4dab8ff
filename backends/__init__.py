"""Execution backends behind one small contract (see ``backends.base``).

Concrete backends are imported by the runtime through a table of lazy import
strings; importing this package imports no native library.
"""

from backends.base import Availability, Backend, CompileOptions, DelegateSpec, Executable, TensorSpec

__all__ = ["Availability", "Backend", "CompileOptions", "DelegateSpec", "Executable", "TensorSpec"]
