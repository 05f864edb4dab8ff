"""device_profiles tests: fake device trees live in ``device_trees`` beside this file."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # importable under any pytest import mode
    sys.path.insert(0, HERE)
