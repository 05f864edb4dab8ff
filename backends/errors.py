"""The one error family of edge-runtime.

It lives here, at the bottom of the import graph, because backends raise
these errors and must not import ``edge_runtime``; ``edge_runtime.errors``
re-exports every name. No error knows an HTTP status: the server maps
them in one table.
"""

from __future__ import annotations


class EdgeRuntimeError(Exception):
    """Base of every error raised on purpose by edge-runtime."""


class InvalidInputError(EdgeRuntimeError, ValueError):
    """A caller's feed is wrong: unknown/missing tensor, dtype, rank or dimension."""


class ModelNotFoundError(EdgeRuntimeError, LookupError):
    """A model name, version or file does not exist."""


class ModelLoadError(EdgeRuntimeError):
    """A model file exists but cannot be read or compiled (corrupt, unsupported)."""


class BackendUnavailableError(EdgeRuntimeError):
    """The backend cannot be used on this device, or cannot take these nodes."""


class UnsupportedNodesError(BackendUnavailableError):
    """A backend was asked to run a graph with nodes it does not claim."""

    def __init__(self, backend: str, nodes: list[str]) -> None:
        self.backend = backend
        self.nodes = list(nodes)
        shown = ", ".join(self.nodes[:20]) + (" ..." if len(self.nodes) > 20 else "")
        super().__init__(
            f"backend {backend!r} cannot take {len(self.nodes)} node(s): {shown}"
        )


class BackendError(EdgeRuntimeError):
    """A backend failed while compiling or running (driver error, lost device)."""


class CloudError(EdgeRuntimeError):
    """A cloud peer could not answer (down, timeout, 5xx, reset)."""


class QueueFullError(EdgeRuntimeError):
    """The request queue is at its bound; the request was rejected at once."""


class DeadlineExceededError(EdgeRuntimeError, TimeoutError):
    """The request's deadline passed before it could run or finish."""


class ConfigError(EdgeRuntimeError, ValueError):
    """A configuration file or override holds an unknown key or a bad value."""
