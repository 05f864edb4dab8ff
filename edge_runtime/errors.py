"""The error family (defined in ``backends.errors`` so backends can raise it too)."""

from backends.errors import (
    BackendError,
    BackendUnavailableError,
    CloudError,
    ConfigError,
    DeadlineExceededError,
    EdgeRuntimeError,
    InvalidInputError,
    ModelLoadError,
    ModelNotFoundError,
    QueueFullError,
    UnsupportedNodesError,
)

__all__ = [
    "BackendError", "BackendUnavailableError", "CloudError", "ConfigError",
    "DeadlineExceededError", "EdgeRuntimeError", "InvalidInputError", "ModelLoadError",
    "ModelNotFoundError", "QueueFullError", "UnsupportedNodesError",
]
