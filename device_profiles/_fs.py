"""Safe readers of procfs/sysfs/build files under a root prefix.

Every function takes ``root`` (``"/"`` for the real device, a directory for a
fake tree) and a device path such as ``"/proc/cpuinfo"``. None of them raises:
a missing, unreadable or undecodable file reads as ``None`` (or ``[]``).
Paths returned by :func:`glob` are device paths (as seen on the device, with
the root prefix removed) so a fake tree reports the same paths as a phone.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

MAX_READ_BYTES = 1 << 20  # /proc/cpuinfo of a 256-core host stays well below this


def is_host(root: str | os.PathLike) -> bool:
    """Whether ``root`` is the real filesystem root (only then may the probe ask the host itself)."""
    return os.path.abspath(os.fspath(root)) == "/"


def host_path(root: str | os.PathLike, device_path: str) -> Path:
    """Where ``device_path`` lies under ``root``."""
    return Path(os.fspath(root)) / device_path.lstrip("/")


def read_bytes(root: str | os.PathLike, device_path: str, max_bytes: int = MAX_READ_BYTES) -> bytes | None:
    """The file's first ``max_bytes`` bytes, or None when it cannot be read."""
    path = host_path(root, device_path)
    try:
        # NOTE: only regular files: opening a FIFO or a device node could block forever.
        if not stat.S_ISREG(path.stat().st_mode):
            return None
        with open(path, "rb") as handle:
            return handle.read(max_bytes)
    except (OSError, ValueError) as exc:
        log.debug("cannot read %s under %s: %s", device_path, root, exc)
        return None


def read_text(root: str | os.PathLike, device_path: str, max_bytes: int = MAX_READ_BYTES) -> str | None:
    """The file's text (UTF-8, bad bytes replaced), or None when it cannot be read."""
    data = read_bytes(root, device_path, max_bytes)
    return None if data is None else data.decode("utf-8", errors="replace")


def read_line(root: str | os.PathLike, device_path: str) -> str | None:
    """The first line of the file, stripped; None when missing or empty."""
    text = read_text(root, device_path, max_bytes=4096)
    if not text:
        return None
    line = text.strip().split("\n", 1)[0].strip()
    return line or None


def read_int(root: str | os.PathLike, device_path: str) -> int | None:
    """The file's first token as an int; None when missing or not a number."""
    return parse_int(read_line(root, device_path))


def parse_int(text: str | None) -> int | None:
    """``text``'s first whitespace-separated token as an int (decimal), or None."""
    tokens = (text or "").split()
    if not tokens:
        return None
    try:
        return int(tokens[0])
    except ValueError:
        return None


def _holds(root: str | os.PathLike, device_path: str, test: Callable[[Path], bool]) -> bool:
    try:
        return test(host_path(root, device_path))
    except (OSError, ValueError):
        return False


def exists(root: str | os.PathLike, device_path: str) -> bool:
    """Whether the path exists (file, directory or device node) under ``root``."""
    return _holds(root, device_path, Path.exists)


def is_file(root: str | os.PathLike, device_path: str) -> bool:
    """Whether the path is a regular file (or a link to one) under ``root``."""
    return _holds(root, device_path, Path.is_file)


def is_dir(root: str | os.PathLike, device_path: str) -> bool:
    """Whether the path is a directory under ``root``."""
    return _holds(root, device_path, Path.is_dir)


def glob(root: str | os.PathLike, pattern: str) -> list[str]:
    """Sorted device paths matching a glob ``pattern`` (an absolute device path)."""
    base = Path(os.fspath(root))
    try:
        found = sorted(base.glob(pattern.lstrip("/")))
    except (OSError, ValueError) as exc:
        log.debug("cannot glob %s under %s: %s", pattern, root, exc)
        return []
    return ["/" + p.relative_to(base).as_posix() for p in found]


def parse_cpu_list(text: str | None) -> list[int] | None:
    """A kernel CPU list such as ``"0-3,6,8-9"`` as sorted ints; None when unparsable."""
    if text is None:
        return None
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None:
            return None
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        if last < first or last - first > 65535:  # garbage, not a CPU range
            return None
        cpus.update(range(first, last + 1))
    return sorted(cpus) if cpus else None


def parse_props(text: str | None) -> dict[str, str]:
    """``key=value`` lines (Android build.prop format); comments and junk lines are skipped."""
    props: dict[str, str] = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.strip()
        if key and " " not in key:
            props[key] = value.strip()
    return props
