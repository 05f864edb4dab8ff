"""The ``tflite`` backend: LiteRT interpreters for ``.tflite`` models, with external delegates.

Importing this package imports no LiteRT module; ``compile`` does, lazily.
"""

from backends.tflite.backend import TFLiteBackend
from backends.tflite.delegates import DelegateStatus
from backends.tflite.executable import TFLiteExecutable

__all__ = ["DelegateStatus", "TFLiteBackend", "TFLiteExecutable"]
