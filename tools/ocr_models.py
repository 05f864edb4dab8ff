"""Where the real PP-OCR det/cls/rec ONNX models are: inside the rapidocr-onnxruntime wheel.

The files are read without importing the package (it would pull in OpenCV).
Used by the tests and benchmarks; an empty dict when the wheel is missing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def ocr_models() -> dict[str, Path]:
    """``{"det"|"cls"|"rec": path}`` of the models the installed wheel ships."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return {}
    folder = Path(list(spec.submodule_search_locations)[0]) / "models"
    return {kind: path for path in folder.glob("*.onnx")
            for kind in ("det", "cls", "rec") if f"_{kind}_" in path.name}
