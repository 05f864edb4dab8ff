"""Calibration samples: read from a folder of ``.npy`` / ``.npz`` files, or seeded from the input specs.

A folder holds one sample per file. A ``.npy`` file feeds a single-input model;
a ``.npz`` file holds one array per input name. Files are read in name order,
so the same folder always gives the same samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from backends.base import TensorSpec
from edge_runtime.errors import InvalidInputError
from edge_runtime.feeds import random_feeds

Sample = dict[str, np.ndarray]


def load_samples(directory: Path, specs: Sequence[TensorSpec]) -> list[Sample]:
    """The samples in ``directory``; raises InvalidInputError naming the file that does not fit."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InvalidInputError(f"calibration folder not found: {directory}")
    files = sorted(p for p in directory.iterdir() if p.suffix in (".npy", ".npz"))
    if not files:
        raise InvalidInputError(f"calibration folder {directory} holds no .npy or .npz files")
    names = [s.name for s in specs]
    samples = []
    for path in files:
        if path.suffix == ".npy":
            if len(names) != 1:
                raise InvalidInputError(f"{path}: a .npy sample feeds a single-input model; this one has "
                                        f"inputs {names}: use .npz files with one array per input")
            sample = {names[0]: np.load(path)}
        else:
            with np.load(path) as archive:
                sample = {key: archive[key] for key in archive.files}
        missing = sorted(set(names) - set(sample))
        if missing:
            raise InvalidInputError(f"{path}: missing input(s) {missing}; expected {names}, got {sorted(sample)}")
        samples.append(_cast(sample, specs, path))
    return samples


def seeded_samples(specs: Sequence[TensorSpec], count: int = 8, seed: int = 0) -> list[Sample]:
    """``count`` seeded random samples (symbolic dims become 1), for models that come without data."""
    return [random_feeds(list(specs), seed=seed + i) for i in range(count)]


def _cast(sample: Sample, specs: Sequence[TensorSpec], path: Path) -> Sample:
    out = {}
    for spec in specs:
        array = np.asarray(sample[spec.name])
        if array.ndim != len(spec.shape):
            raise InvalidInputError(f"{path}: input {spec.name!r} has rank {array.ndim}, expected "
                                    f"{len(spec.shape)} (shape {list(spec.shape)})")
        out[spec.name] = array.astype(spec.dtype, copy=False)
    return out


class SampleReader:
    """``onnxruntime.quantization.CalibrationDataReader`` over a list of samples, with a progress callback.

    Written as a duck-typed reader (``get_next``/``rewind``) so this module does
    not import onnxruntime; ORT calls nothing else on it.
    """

    def __init__(self, samples: Sequence[Sample], on_sample: "callable | None" = None) -> None:
        self._samples = list(samples)
        self._on_sample = on_sample
        self._iter: Iterator[Sample] = iter(self._samples)

    def __len__(self) -> int:
        return len(self._samples)

    def get_next(self) -> Sample | None:
        sample = next(self._iter, None)
        if sample is not None and self._on_sample is not None:
            self._on_sample()
        return sample

    def rewind(self) -> None:
        self._iter = iter(self._samples)
