"""Android system properties: from ``getprop`` on the device, else from build.prop files."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess

from device_profiles import _fs

log = logging.getLogger(__name__)

PROP_FILES = ("/system/build.prop", "/vendor/build.prop", "/system/vendor/build.prop",
              "/odm/etc/build.prop", "/product/etc/build.prop", "/default.prop")
GETPROP_TIMEOUT_S = 3.0
_GETPROP_LINE = re.compile(r"^\[([^\]]+)\]: \[(.*)\]$")


def parse_getprop(text: str | None) -> dict[str, str]:
    """``getprop`` output (``[key]: [value]`` lines) as a dict; junk lines are skipped."""
    props: dict[str, str] = {}
    for line in (text or "").splitlines():
        match = _GETPROP_LINE.match(line.strip())
        if match:
            props[match.group(1)] = match.group(2)
    return props


def _run_getprop() -> dict[str, str]:
    binary = shutil.which("getprop")
    if binary is None:
        return {}
    try:
        done = subprocess.run([binary], capture_output=True, text=True, timeout=GETPROP_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("getprop failed: %s", exc)
        return {}
    return parse_getprop(done.stdout)


def read_props(root: str | os.PathLike) -> tuple[dict[str, str], bool]:
    """``(properties, is_android)``.

    On the real root ``getprop`` is asked first (it sees runtime properties
    such as ``ro.boot.*``); build.prop files fill what it lacks. ``ro.*``
    properties are set once, so the first file that names one wins.
    """
    props = _run_getprop() if _fs.is_host(root) else {}
    is_android = bool(props)
    for path in PROP_FILES:
        text = _fs.read_text(root, path)
        if text is None:
            continue
        is_android = is_android or path != "/default.prop" or "ro.build" in text
        for key, value in _fs.parse_props(text).items():
            props.setdefault(key, value)
    return props, is_android


def summarise(props: dict[str, str]) -> dict:
    """The Android facts the catalogue and the runtime use, from raw properties."""

    def first(*keys: str) -> str | None:
        return next((props[k] for k in keys if props.get(k)), None)

    sdk = first("ro.build.version.sdk", "ro.system.build.version.sdk")
    return {
        "release": first("ro.build.version.release", "ro.system.build.version.release"),
        "sdk": int(sdk) if sdk and sdk.isdigit() else None,
        "model": first("ro.product.model", "ro.product.vendor.model", "ro.product.system.model"),
        "manufacturer": first("ro.product.manufacturer", "ro.product.vendor.manufacturer",
                              "ro.product.system.manufacturer"),
        "board": first("ro.product.board", "ro.product.vendor.board"),
        "platform": first("ro.board.platform"),
        "hardware": first("ro.hardware", "ro.boot.hardware"),
        "fingerprint": first("ro.build.fingerprint", "ro.vendor.build.fingerprint",
                             "ro.system.build.fingerprint"),
        "soc": first("ro.soc.model"),
        "egl": first("ro.hardware.egl"),
        "vulkan": first("ro.hardware.vulkan"),
        "is_emulator": props.get("ro.kernel.qemu") == "1" or props.get("ro.boot.qemu") == "1",
    }
