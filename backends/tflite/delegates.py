"""Loading TFLite external delegates, and what the executable reports about them.

A delegate that cannot be used never stops a model: the executable runs on
the CPU and says why in a :class:`DelegateStatus` (and a warning in the log).
How ``load_delegate`` fails, measured on ai-edge-litert 2.3.0:

==========================================  ==========================================
missing library                             ``OSError`` (cannot open shared object file)
no ``tflite_plugin_create_delegate``        ``AttributeError`` (undefined symbol)
create returned NULL                        ``ValueError: Failed to load delegate from …``
delegate ``Prepare`` failed                 ``RuntimeError`` from the Interpreter constructor
==========================================  ==========================================

The first two are caught here, before ``load_delegate``, by opening the
library with ctypes: LiteRT's ``Delegate.__del__`` would otherwise print an
"Exception ignored" traceback for a half-built object.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from backends.base import DelegateSpec
from backends.tflite.coverage import Coverage

log = logging.getLogger(__name__)

_PLUGIN_SYMBOLS = ("tflite_plugin_create_delegate", "tflite_plugin_destroy_delegate")


@dataclass(frozen=True)
class DelegateStatus:
    """What became of one requested delegate.

    ``loaded`` is True only when the library loaded *and* the interpreter
    accepted it; ``error`` then is "". A delegate not loaded covers 0 nodes.
    ``options`` are the options actually passed (with any added by the backend).
    """

    library: str
    loaded: bool
    error: str
    coverage: Coverage
    options: tuple[tuple[str, str], ...] = ()

    @property
    def low_coverage(self) -> bool:
        """See :attr:`Coverage.low_coverage`."""
        return self.coverage.low_coverage

    def to_dict(self) -> dict[str, Any]:
        return {"library": self.library, "loaded": self.loaded, "error": self.error,
                **self.coverage.to_dict(), "options": dict(self.options)}


def is_gpu_delegate(library: str) -> bool:
    """Whether ``library`` is a GPU delegate, by its file name (``libtensorflowlite_gpu_delegate.so``)."""
    return "gpu" in Path(library).name.lower()


def model_token(model_bytes: bytes, cache_key_extra: str) -> str:
    """The GPU delegate's ``model_token``: a hash of the model bytes and the device/build key."""
    digest = hashlib.sha256(model_bytes)
    digest.update(b"|" + cache_key_extra.encode())
    return digest.hexdigest()[:32]


def delegate_options(spec: DelegateSpec, model_bytes: bytes, cache_dir: Path | None,
                     cache_key_extra: str = "") -> dict[str, str]:
    """The options to pass for ``spec``: its own, plus GPU serialization when it applies.

    A GPU delegate with a cache directory also gets ``serialization_dir``
    (``cache_dir/tflite``, created) and ``model_token``, so its compiled
    kernels are reused on the next start. Options the spec sets win.
    """
    options = {str(key): str(value) for key, value in spec.options}
    if cache_dir is not None and is_gpu_delegate(spec.library):
        serialization_dir = Path(cache_dir) / "tflite"
        serialization_dir.mkdir(parents=True, exist_ok=True)
        options.setdefault("serialization_dir", str(serialization_dir))
        options.setdefault("model_token", model_token(model_bytes, cache_key_extra))
    return options


def load_delegate(litert: ModuleType, library: str, options: dict[str, str]) -> tuple[Any | None, str]:
    """``(delegate, "")`` on success, ``(None, reason)`` when the library cannot give a delegate."""
    try:
        handle = ctypes.CDLL(library)
    except OSError as exc:
        return None, f"OSError: cannot load {library}: {exc}"
    missing = [symbol for symbol in _PLUGIN_SYMBOLS if not hasattr(handle, symbol)]
    if missing:
        return None, f"AttributeError: {library} is not a TFLite external delegate (missing {', '.join(missing)})"
    try:
        return litert.load_delegate(library, options), ""
    except (OSError, AttributeError, ValueError, RuntimeError) as exc:
        # ValueError: create returned NULL; its message carries the delegate's report.
        return None, f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def failed(library: str, error: str, options: dict[str, str], total_nodes: int) -> DelegateStatus:
    """A status for a delegate that will not be used; logs the warning the fallback owes."""
    log.warning("tflite: delegate %s not used, running on CPU: %s", library, error)
    return DelegateStatus(library, False, error, Coverage(0, 0, total_nodes), tuple(options.items()))
