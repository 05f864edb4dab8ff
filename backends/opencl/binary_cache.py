"""Program binaries on disk, checked before the driver ever sees them.

A file is ``MAGIC | sha256(payload) | payload``. Its name is a hash of the
device identity, the caller's fingerprint, the source and the build options,
so a driver update or a kernel edit never loads a stale binary.

# NOTE: PoCL aborts the whole process (an assert in pocl_binary.c) when
# handed a truncated binary, so the checksum here is what keeps a corrupt
# cache file from crashing the runtime: only intact payloads reach
# clCreateProgramWithBinary.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

MAGIC = b"ERTCLB01"
_DIGEST_BYTES = 32


def binary_key(device_identity: str, key_extra: str, source: str, options: str) -> str:
    """The cache key of one program build."""
    digest = hashlib.sha256()
    for part in (device_identity, key_extra, options, source):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:40]


class BinaryCache:
    """``cache_dir/opencl/binaries/<key>.bin`` files; all methods are best effort."""

    def __init__(self, root: Path) -> None:
        self.root = root / "binaries"

    def path(self, key: str) -> Path:
        return self.root / f"{key}.bin"

    def load(self, key: str) -> tuple[bytes | None, bool]:
        """``(payload, rejected)``: the payload if the file exists and is intact.

        A corrupt or truncated file is deleted and reported as rejected.
        """
        path = self.path(key)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None, False
        except OSError as exc:
            log.warning("opencl: cannot read cached binary %s: %s", path, exc)
            return None, False
        head = len(MAGIC) + _DIGEST_BYTES
        payload = blob[head:]
        if (len(blob) <= head or blob[:len(MAGIC)] != MAGIC
                or hashlib.sha256(payload).digest() != blob[len(MAGIC):head]):
            log.warning("opencl: cached binary %s is corrupt or truncated; rebuilding", path)
            self.discard(key)
            return None, True
        return payload, False

    def store(self, key: str, payload: bytes) -> None:
        """Write atomically (temp file + rename) so readers never see half a file."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
            with os.fdopen(fd, "wb") as handle:
                handle.write(MAGIC + hashlib.sha256(payload).digest() + payload)
            os.replace(tmp, self.path(key))
        except OSError as exc:
            log.warning("opencl: cannot write binary cache %s: %s", self.root, exc)

    def discard(self, key: str) -> None:
        try:
            self.path(key).unlink(missing_ok=True)
        except OSError as exc:
            log.warning("opencl: cannot delete cached binary %s: %s", key, exc)
