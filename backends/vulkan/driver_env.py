"""Process environment the Vulkan driver and ONNX Runtime read when they load.

These are the engines' own switches, not edge-runtime configuration: Mesa reads
``MESA_SHADER_CACHE_DIR`` when a driver instance starts, ONNX Runtime's WebGPU
EP reads ``ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER`` when its library is
registered. Both must be in ``os.environ`` before that moment, so the backend
sets them itself, once, before it loads anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SHADER_CACHE_ENV = "MESA_SHADER_CACHE_DIR"
SOFTWARE_ADAPTER_ENV = "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER"


@dataclass(frozen=True)
class ShaderCache:
    """Where Mesa keeps compiled shaders, and whether it was empty when this process started using it."""

    path: str | None
    fresh: bool
    owner: str  # "edge-runtime" (under the runtime cache dir), "user" (already set), "none"

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "fresh": self.fresh, "owner": self.owner}


def prepare_shader_cache(cache_dir: Path | None) -> ShaderCache:
    """Point Mesa's on-disk shader cache under ``cache_dir/vulkan/mesa`` (unless the user chose one).

    Call before any Vulkan driver loads in this process; later calls keep the first answer's path.
    """
    chosen = os.environ.get(SHADER_CACHE_ENV)
    owner = "user"
    if not chosen and cache_dir is not None:
        chosen = str(Path(cache_dir) / "vulkan" / "mesa")
        os.environ[SHADER_CACHE_ENV] = chosen
        owner = "edge-runtime"
    if not chosen:
        return ShaderCache(None, True, "none")
    path = Path(chosen)
    path.mkdir(parents=True, exist_ok=True)
    fresh = not any(path.iterdir())
    return ShaderCache(chosen, fresh, owner)


def allow_software_adapter() -> None:
    """Let ONNX Runtime offer its WebGPU EP without a GPU in ``/sys/class/drm`` (a software device, by name)."""
    os.environ[SOFTWARE_ADAPTER_ENV] = "1"


def child_env(software: bool) -> dict[str, str]:
    """The environment for a driver-probing child: this process's, with the switches it needs."""
    env = dict(os.environ)
    if software:
        env[SOFTWARE_ADAPTER_ENV] = "1"
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env
