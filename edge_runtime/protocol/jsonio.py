"""JSON in and out of the wire: orjson where installed (the server extra), else the stdlib.

orjson parses and writes the tensor-heavy bodies of the v2 protocol several times
faster than ``json``; the cloud client's minimal install may lack it. NOTE: orjson
writes NaN and infinities as ``null`` (strict JSON has no spelling for them); the
stdlib writes the non-standard ``NaN``/``Infinity`` tokens. Binary tensors carry them
exactly either way.
"""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - the server extra installs it
    orjson = None  # type: ignore[assignment]

DecodeError = json.JSONDecodeError  # orjson.JSONDecodeError subclasses it


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse a JSON document; raises ``DecodeError`` (a ValueError) or UnicodeDecodeError."""
    if orjson is not None:
        return orjson.loads(data)
    return json.loads(bytes(data) if isinstance(data, memoryview) else data)


def dumps(document: Any) -> bytes:
    """Compact UTF-8 JSON."""
    if orjson is not None:
        return orjson.dumps(document)
    return json.dumps(document, separators=(",", ":")).encode()
