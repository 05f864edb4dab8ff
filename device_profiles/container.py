"""Whether we run in a container (docker, podman, LXC, Kubernetes, redroid/anbox/waydroid) or a VM."""

from __future__ import annotations

import os

from device_profiles import _fs

_CGROUP_WORDS = ("docker", "lxc", "kubepods", "containerd", "libpod", "crio")
_ANDROID_CONTAINER_WORDS = ("redroid", "anbox", "waydroid")
_ANDROID_NAME_PROPS = ("ro.product.model", "ro.product.name", "ro.product.device", "ro.product.brand",
                       "ro.hardware", "ro.boot.hardware", "ro.product.vendor.model")


def _android_markers(props: dict[str, str]) -> tuple[list[str], list[str]]:
    """(container markers, VM markers) from Android properties."""
    container: list[str] = []
    for key in _ANDROID_NAME_PROPS:
        value = props.get(key, "")
        if any(word in value.lower() for word in _ANDROID_CONTAINER_WORDS):
            container.append(f"android prop {key}={value}")
    container += [f"android prop {key}" for key in sorted(props)
                  if key.startswith(("ro.boot.redroid", "ro.anbox", "waydroid."))][:3]
    vm = [f"android prop {key}=1" for key in ("ro.kernel.qemu", "ro.boot.qemu") if props.get(key) == "1"]
    return container, vm


def read_container(root: str | os.PathLike, props: dict[str, str]) -> dict:
    """``{in_container, virtualized, markers, vm_markers, weak_markers}``.

    ``markers`` are decisive container evidence; ``vm_markers`` say the
    system is an emulator/VM (``ro.kernel.qemu``); ``virtualized`` is either.
    ``weak_markers`` (binder nodes) are listed for explanations only: real
    phones have them too.
    """
    markers = [f"file {p}" for p in ("/.dockerenv", "/run/.containerenv") if _fs.exists(root, p)]
    systemd = _fs.read_line(root, "/run/systemd/container")
    if systemd:
        markers.append(f"/run/systemd/container={systemd}")
    init_cgroup = (_fs.read_text(root, "/proc/1/cgroup", max_bytes=65536) or "").lower()
    markers += [f"/proc/1/cgroup mentions {w}" for w in _CGROUP_WORDS if w in init_cgroup][:2]
    environ = _fs.read_text(root, "/proc/1/environ", max_bytes=65536) or ""
    markers += [f"/proc/1/environ {v}" for v in environ.split("\0") if v.startswith("container=")][:1]
    android_container, vm_markers = _android_markers(props)
    markers += android_container
    weak = [f"device {p}" for p in ("/dev/binder", "/dev/binderfs") if _fs.exists(root, p)]
    return {"in_container": bool(markers), "virtualized": bool(markers or vm_markers), "markers": markers,
            "vm_markers": vm_markers, "weak_markers": weak}
