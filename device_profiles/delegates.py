"""TFLite delegate libraries on the usual paths (vendor images, adb-pushed, desktop installs)."""

from __future__ import annotations

import os

from device_profiles import _fs

# Directories a delegate library is found in; only *delegate*.so* files directly inside count.
SEARCH_DIRS = ("/vendor/lib64", "/system/lib64", "/system/vendor/lib64", "/odm/lib64", "/data/local/tmp",
               "/usr/lib/*", "/usr/lib", "/usr/local/lib", "/usr/local/lib/*")
# Substring of the lower-cased file name -> kind; first match wins (armnn before gpu).
_KINDS = (("armnn", "armnn"), ("hexagon", "hexagon"), ("vulkan", "vulkan"), ("gpu", "gpu"))
# Words that make a *delegate*.so a TFLite delegate; without one (libabsl_throw_delegate.so…)
# only files adb-pushed to /data/local/tmp count.
_TFLITE_WORDS = ("tensorflowlite", "tflite", "litert", "armnn", "hexagon", "gpu", "vulkan", "nnapi",
                 "xnnpack", "qnn", "edgetpu", "neuron", "npu")
PUSHED_DIR = "/data/local/tmp"


def delegate_kind(filename: str) -> str:
    """"gpu", "armnn", "hexagon", "vulkan" or "other", from a library's file name."""
    lowered = os.path.basename(filename).lower()
    return next((kind for word, kind in _KINDS if word in lowered), "other")


def is_delegate_name(path: str) -> bool:
    """Whether a library path names a TFLite delegate the probe reports (see ``find_delegates``)."""
    name = os.path.basename(path).lower()
    if "delegate" not in name or ".so" not in name:
        return False
    return os.path.dirname(path) == PUSHED_DIR or any(word in name for word in _TFLITE_WORDS)


def find_delegates(root: str | os.PathLike) -> list[dict]:
    """``[{path, kind}]`` for every TFLite delegate library in ``SEARCH_DIRS``, sorted, each path once.

    A library counts when its name holds "delegate" and a TFLite word
    ("gpu", "armnn", "hexagon", "vulkan", "tflite", …); in /data/local/tmp any
    ``*delegate*.so`` counts (pushed there on purpose).
    """
    paths: set[str] = set()
    for directory in SEARCH_DIRS:
        for pattern in ("*[Dd]elegate*.so", "*[Dd]elegate*.so.*"):
            paths.update(p for p in _fs.glob(root, f"{directory}/{pattern}")
                         if is_delegate_name(p) and _fs.is_file(root, p))
    return [{"path": p, "kind": delegate_kind(p)} for p in sorted(paths)]
