"""ONNX -> ncnn conversion with pnnx's standalone binary, into a cache.

Conversions live in ``<cache>/ncnn/<key>/`` with ``model.ncnn.param``,
``model.ncnn.bin`` and ``manifest.json``. The key is a digest of the model
bytes, the per-sample input shapes and the precision (never the pnnx
version), so a device without pnnx finds a folder converted elsewhere and
copied over; ``manifest.json`` records the pnnx version that made it, and a
device *with* a different pnnx converts again (invalidation on pnnx upgrade).
A changed model has other bytes, hence another key.

pnnx is an optional dependency used at conversion time only: the PyPI
``pnnx`` wheel installed with ``--no-deps`` (its Python wrapper wants torch;
the bundled binary does not).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from backends.errors import BackendUnavailableError, ModelLoadError

log = logging.getLogger(__name__)

CONVERT_TIMEOUT_S = 300.0
PARAM, BIN, MANIFEST = "model.ncnn.param", "model.ncnn.bin", "manifest.json"


class ConversionError(ModelLoadError):
    """pnnx could not turn this model into an ncnn model; ``detail`` holds its last output lines."""

    def __init__(self, message: str, detail: str = "") -> None:
        self.detail = detail
        super().__init__(message + (f"\npnnx said:\n{detail}" if detail else ""))


@dataclass(frozen=True)
class Conversion:
    """An ncnn model on disk for one set of per-sample input shapes."""

    folder: Path
    shapes: tuple[tuple[int, ...], ...]
    pnnx_version: str
    converted_now: bool

    @property
    def param(self) -> Path:
        return self.folder / PARAM

    @property
    def bin(self) -> Path:
        return self.folder / BIN


def pnnx_binary() -> Path | None:
    """The pnnx executable from the ``pnnx`` wheel, else one on PATH, else None."""
    spec = importlib.util.find_spec("pnnx")
    if spec is not None and spec.submodule_search_locations:
        candidate = Path(list(spec.submodule_search_locations)[0]) / "pnnx"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("pnnx")
    return Path(found) if found else None


def pnnx_version() -> str | None:
    """The installed pnnx wheel's version, else a digest of the pnnx binary on PATH, else None."""
    from importlib import metadata

    try:
        return metadata.version("pnnx")
    except metadata.PackageNotFoundError:
        found = shutil.which("pnnx")
        return _binary_digest(found) if found else None


@functools.lru_cache(maxsize=8)
def _binary_digest(path: str) -> str:
    """A binary outside a wheel has no version to ask; its bytes identify it."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return f"binary-{digest.hexdigest()[:12]}"


def conversion_key(model_bytes: bytes, shapes: Sequence[Sequence[int]], precision: str) -> str:
    digest = hashlib.sha256(model_bytes)
    digest.update(json.dumps({"shapes": [list(s) for s in shapes], "precision": precision}).encode())
    return digest.hexdigest()[:32]


def cached_or_convert(model_bytes: bytes, shapes: Sequence[Sequence[int]], cache_dir: Path,
                      precision: str = "fp32") -> Conversion:
    """The ncnn model for ``shapes``, from the cache or converted now.

    Raises BackendUnavailableError (no cached conversion and no pnnx) or
    ConversionError (pnnx failed; the message carries its output).
    """
    shapes = tuple(tuple(int(d) for d in s) for s in shapes)
    folder = Path(cache_dir) / "ncnn" / conversion_key(model_bytes, shapes, precision)
    installed = pnnx_version()
    made_by = _manifest_version(folder)
    if made_by is not None and (installed is None or made_by == installed):
        return Conversion(folder, shapes, made_by, converted_now=False)
    if made_by is not None:
        log.info("ncnn: %s was converted by pnnx %s; pnnx %s converts it again", folder, made_by, installed)
    binary = pnnx_binary()
    if binary is None or installed is None:
        raise BackendUnavailableError(
            "ncnn: no converted model in the cache and pnnx is not installed "
            "(pip install --no-deps pnnx, or copy a folder made by `edge-runtime convert`)")
    convert(model_bytes, shapes, folder, binary, installed, precision)
    return Conversion(folder, shapes, installed, converted_now=True)


def convert(model_bytes: bytes, shapes: Sequence[Sequence[int]], folder: Path, binary: Path, version: str,
            precision: str = "fp32") -> None:
    """Run pnnx on the model in a scratch folder; move the ncnn files into ``folder`` atomically."""
    shape_arg = ",".join("[" + ",".join(str(d) for d in s) + "]" for s in shapes)
    log.warning("ncnn: converting model (%d bytes, input %s) with pnnx %s ...", len(model_bytes), shape_arg,
                version)  # a progress line: conversion takes seconds, a user should know why
    started = time.perf_counter()
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pnnx-", dir=folder.parent) as scratch:
        work = Path(scratch)
        (work / "model.onnx").write_bytes(model_bytes)
        command = [str(binary), "model.onnx", f"inputshape={shape_arg}",
                   f"fp16={1 if precision == 'fp16' else 0}"]
        try:
            done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=CONVERT_TIMEOUT_S,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            raise ConversionError(f"ncnn: pnnx did not finish within {CONVERT_TIMEOUT_S:.0f} s") from exc
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-12:])
        param, weights = work / PARAM, work / BIN
        if done.returncode != 0 or not param.is_file() or not weights.is_file():
            raise ConversionError(f"ncnn: pnnx could not convert the model (exit {done.returncode})", tail)
        _check_param(param, tail)
        (work / MANIFEST).write_text(json.dumps({"pnnx_version": version, "shapes": [list(s) for s in shapes],
                                                 "precision": precision}))
        staged = work / "out"
        staged.mkdir()
        for name in (PARAM, BIN, MANIFEST):
            os.replace(work / name, staged / name)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staged, folder)
    log.warning("ncnn: converted in %.2f s into %s", time.perf_counter() - started, folder)


def _check_param(param: Path, tail: str) -> None:
    """pnnx writes layers it cannot map as pnnx ops (``pnnx.Expression``, ``aten::...``, ``F.``)."""
    unmapped = sorted({line.split()[0] for line in param.read_text().splitlines()[2:]
                       if line.split() and any(line.startswith(p) for p in ("pnnx.", "aten::", "F.", "torch.", "Tensor."))})
    if unmapped:
        raise ConversionError(f"ncnn: pnnx left {len(unmapped)} layer type(s) ncnn cannot run: "
                              f"{', '.join(unmapped)}", tail)


def _manifest_version(folder: Path) -> str | None:
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not ((folder / PARAM).is_file() and (folder / BIN).is_file()):
        return None
    version = data.get("pnnx_version") if isinstance(data, dict) else None
    return str(version) if version else None
