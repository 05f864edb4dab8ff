"""How a benchmark hands over its result: JSON on stdout, and ``<stem>.json`` + ``<stem>.png`` in a folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


def publish(result: dict[str, Any], out: Path, stem: str, plot: Callable[[dict[str, Any], Path], None]) -> None:
    """Write ``out/<stem>.json``, draw ``out/<stem>.png`` with ``plot``, print the JSON."""
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2)
    (out / f"{stem}.json").write_text(text)
    plot(result, out / f"{stem}.png")
    print(text)
