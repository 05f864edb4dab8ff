"""The repository's layout on disk: model names, version folders, model files, ``[serving]``.

``[serving]`` (this module's section of the per-model config)::

    backend = "auto"           # or "cpu", "opencl", "tflite", "null"
    version_policy = "latest"  # "latest" (highest version only), "all", or a list: [1, 3]
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.errors import ConfigError, InvalidInputError, ModelLoadError, ModelNotFoundError

# NOTE: at most 255 characters, NAME_MAX of common file systems: a longer name is an OSError, not a 404.
MODEL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,255}$")
MODEL_FILES = ("model.onnx", "model.tflite")


def check_model_name(name: str) -> str:
    """``name`` if it is a safe model name (``MODEL_NAME``, not only dots), else InvalidInputError."""
    if not MODEL_NAME.fullmatch(name) or set(name) == {"."}:
        raise InvalidInputError(f"invalid model name {name[:60]!r}: use 1 to 255 letters, digits, '_', '.', '-' "
                                "(not only dots)")
    return name


def is_decimal(text: str) -> bool:
    """ASCII digits only, at most 18 of them: what ``int()`` turns into an int64 without surprise.

    NOTE: ``str.isdigit`` also accepts '²' and other digits ``int()`` refuses, and ``int()``
    refuses more than 4300 digits: both would be a 500 instead of a 400.
    """
    return 0 < len(text) <= 18 and text.isascii() and text.isdigit()


def parse_version(text: str) -> int:
    """A version from a URL; InvalidInputError unless a positive integer."""
    if not is_decimal(text) or int(text) < 1:
        raise InvalidInputError(f"invalid model version {text[:40]!r}: versions are positive integers")
    return int(text)


@dataclass(frozen=True)
class ServingConfig:
    backend: str = "auto"
    version_policy: str | tuple[int, ...] = "latest"

    def __post_init__(self) -> None:
        if isinstance(self.version_policy, str) and self.version_policy not in ("latest", "all"):
            raise ConfigError(f"[serving] version_policy must be 'latest', 'all' or a list of versions, "
                              f"got {self.version_policy!r}")

    def select(self, name: str, on_disk: list[int]) -> list[int]:
        if self.version_policy == "latest":
            return on_disk[-1:]
        if self.version_policy == "all":
            return list(on_disk)
        missing = sorted(set(self.version_policy) - set(on_disk))
        if missing:
            raise ModelNotFoundError(f"model {name!r}: version_policy names version(s) {missing}, "
                                     f"the repository has {on_disk}")
        return sorted(set(self.version_policy))


def holds_model(directory: Path) -> bool:
    """True when ``directory`` itself holds a model: a ``MODEL_FILES`` file or a generative folder
    (reads no ONNX): a repository's model folder without version folders is served as version 1."""
    from edge_runtime.generation.folder import is_generative_folder

    return any((directory / name).is_file() for name in MODEL_FILES) or is_generative_folder(directory)


def model_file(version_dir: Path) -> Path:
    """The model file of a version folder; ModelLoadError when it has none."""
    for file_name in MODEL_FILES:
        if (version_dir / file_name).is_file():
            return version_dir / file_name
    from edge_runtime.generation.folder import is_generative_folder

    if is_generative_folder(version_dir):  # a VLM folder keeps its graphs under onnx/: the folder is the model
        return version_dir / "config.json"
    raise ModelLoadError(f"{version_dir}: no {' or '.join(MODEL_FILES)}")


def demo_repository(cache_dir: Path) -> Path:
    """A one-model repository serving the demo CNN as ``demo`` version 1 (built on first use)."""
    from edge_runtime.demo import demo_model_path

    source = demo_model_path(cache_dir)
    root = Path(cache_dir) / "server" / "demo-repository"
    target = root / "demo" / "1" / "model.onnx"
    if not target.is_file() or target.stat().st_size != source.stat().st_size:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        shutil.copyfile(source, tmp)
        tmp.replace(target)
    return root
