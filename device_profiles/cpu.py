"""CPU facts: architecture, cores (logical / online / usable), clusters, ISA features."""

from __future__ import annotations

import math
import os
import platform
import struct
from collections import Counter

from device_profiles import _fs

# Kernel "Features" names on ARM -> the names the catalogue and backends use.
_ARM_FEATURES = {
    "asimd": "neon", "neon": "neon", "asimddp": "dotprod", "fphp": "fp16", "asimdhp": "fp16",
    "i8mm": "i8mm", "sve": "sve", "sve2": "sve2", "bf16": "bf16", "sme": "sme",
}
# AT_HWCAP (16) / AT_HWCAP2 (26) bits of an aarch64 kernel (uapi asm/hwcap.h) -> its cpuinfo words.
_AARCH64_HWCAPS = {
    (16, 1): "asimd", (16, 9): "fphp", (16, 10): "asimdhp", (16, 20): "asimddp", (16, 22): "sve",
    (26, 1): "sve2", (26, 13): "i8mm", (26, 14): "bf16", (26, 23): "sme",
}
# The x86 flags that matter for inference kernels (ORT/XNNPACK dispatch on these).
_X86_FEATURES = frozenset({"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "f16c"})
_X86_MARKERS = frozenset({"sse2", "lm", "cx8", "fpu"})
# (implementer, part) from /proc/cpuinfo -> core name; only cores seen in phones and ARM servers.
_ARM_PARTS = {
    (0x41, 0xD03): "Cortex-A53", (0x41, 0xD04): "Cortex-A35", (0x41, 0xD05): "Cortex-A55",
    (0x41, 0xD07): "Cortex-A57", (0x41, 0xD08): "Cortex-A72", (0x41, 0xD09): "Cortex-A73",
    (0x41, 0xD0A): "Cortex-A75", (0x41, 0xD0B): "Cortex-A76", (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD0D): "Cortex-A77", (0x41, 0xD40): "Neoverse-V1", (0x41, 0xD41): "Cortex-A78",
    (0x41, 0xD44): "Cortex-X1", (0x41, 0xD46): "Cortex-A510", (0x41, 0xD47): "Cortex-A710",
    (0x41, 0xD48): "Cortex-X2", (0x41, 0xD49): "Neoverse-N2", (0x41, 0xD4D): "Cortex-A715",
    (0x41, 0xD4E): "Cortex-X3", (0x41, 0xD4F): "Neoverse-V2", (0x41, 0xD80): "Cortex-A520",
    (0x41, 0xD81): "Cortex-A720", (0x41, 0xD82): "Cortex-X4",
}


def parse_cpuinfo(text: str | None) -> tuple[list[dict[str, str]], dict[str, str]]:
    """``/proc/cpuinfo`` as (one dict per ``processor`` block, fields outside any block)."""
    blocks: list[dict[str, str]] = []
    header: dict[str, str] = {}
    current: dict[str, str] | None = None
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            current = None  # a blank line ends a block
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "processor":
            current = {}
            blocks.append(current)
        (current if current is not None else header)[key] = value
    return blocks, header


def infer_arch(blocks: list[dict[str, str]], header: dict[str, str]) -> str | None:
    """The architecture a cpuinfo describes (for fake trees); None when it says too little."""
    fields = [header, *blocks]
    words = {w for f in fields for key in ("features", "flags") for w in f.get(key, "").split()}
    if any("cpu implementer" in f for f in fields) or "asimd" in words:
        architecture = next((f["cpu architecture"] for f in fields if "cpu architecture" in f), "8")
        return "armv7l" if architecture.strip() == "7" and "asimd" not in words else "aarch64"
    if words & _X86_MARKERS and any("flags" in f for f in fields):
        return "x86_64" if "lm" in words else "i686"
    return None


def normalise_features(blocks: list[dict[str, str]], header: dict[str, str], arch: str | None) -> list[str]:
    """The catalogue's feature names present on every core (big.LITTLE cores may differ)."""
    per_core = [set(f.get("features", f.get("flags", "")).split()) for f in (blocks or [header])]
    common = set.intersection(*per_core) if per_core else set()
    if arch in ("x86_64", "i686"):
        return sorted(common & _X86_FEATURES)
    return sorted({_ARM_FEATURES[w] for w in common if w in _ARM_FEATURES})


def hwcap_words(auxv: bytes | None) -> set[str] | None:
    """Kernel feature words from an aarch64 ``/proc/self/auxv``; None when it holds no AT_HWCAP.

    The auxiliary vector is what this process's user space (ONNX Runtime's and
    XNNPACK's kernel dispatch) sees, also where ``/proc/cpuinfo`` does not
    describe the CPU: under qemu-user it is the host's, and some Android
    kernels drop its ``Features`` line. Entries are (type, value) pairs of
    little-endian 64-bit words, the layout of every arm64 phone and server.
    """
    if not auxv or len(auxv) % 16:
        return None
    entries = dict(struct.iter_unpack("<QQ", auxv))
    if 16 not in entries:
        return None
    return {word for (kind, bit), word in _AARCH64_HWCAPS.items() if entries.get(kind, 0) >> bit & 1}


def model_name(blocks: list[dict[str, str]], header: dict[str, str]) -> str | None:
    """x86 ``model name``; on ARM the core mix (``"4x Cortex-A510 + 3x Cortex-A710 + 1x Cortex-X2"``)."""
    names = [b["model name"] for b in blocks if b.get("model name")]
    cores: Counter[str] = Counter()
    for block in blocks:
        implementer, part = _hex(block.get("cpu implementer")), _hex(block.get("cpu part"))
        if implementer is not None and part is not None:
            cores[_ARM_PARTS.get((implementer, part), f"0x{implementer:02x}:0x{part:03x}")] += 1
    if cores:
        mix = " + ".join(f"{n}x {name}" for name, n in cores.items())
        return f"{header['hardware']} ({mix})" if header.get("hardware") else mix
    if names and not names[0].lower().startswith("arm"):
        return names[0]
    return header.get("hardware") or header.get("model name") or (names[0] if names else None)


def _hex(text: str | None) -> int | None:
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None


def clusters(root: str | os.PathLike, cpus: list[int]) -> list[dict]:
    """CPUs grouped by ``cpufreq/cpuinfo_max_freq``; one cluster with None when cpufreq is absent."""
    by_freq: dict[int | None, list[int]] = {}
    for cpu in cpus:
        freq = _fs.read_int(root, f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq")
        by_freq.setdefault(freq if freq and freq > 0 else None, []).append(cpu)
    groups = [{"cpus": members, "max_freq_khz": freq} for freq, members in by_freq.items()]
    return sorted(groups, key=lambda g: g["cpus"][0])


def read_cpu(root: str | os.PathLike, cgroup: dict) -> tuple[dict, str | None]:
    """``(cpu facts, arch)``.

    ``usable_cores`` = min(online cores, affinity / cgroup cpuset, ceil(cgroup
    CPU quota)), at least 1. The affinity mask and ``platform.machine()`` are
    asked of the host only when ``root`` is "/"; a fake tree answers alone.
    ``features`` come from the auxiliary vector on aarch64 where it can be
    read (:func:`hwcap_words`), else from the cpuinfo lines of every core.
    """
    blocks, header = parse_cpuinfo(_fs.read_text(root, "/proc/cpuinfo"))
    host = _fs.is_host(root)
    described = infer_arch(blocks, header)
    arch = _normalise_arch(platform.machine()) if host else described
    # NOTE: under qemu-user emulation /proc/cpuinfo is the host's (an x86 CPU under an arm64
    # process): its features and model name are not this CPU's.
    foreign = host and described is not None and described != arch
    hwcaps = hwcap_words(_fs.read_bytes(root, "/proc/self/auxv", 4096)) if arch == "aarch64" else None
    if hwcaps is not None:
        features = sorted({_ARM_FEATURES[w] for w in hwcaps if w in _ARM_FEATURES})
    else:
        features = [] if foreign else normalise_features(blocks, header, arch)
    present = _fs.parse_cpu_list(_fs.read_line(root, "/sys/devices/system/cpu/present"))
    possible = present or _fs.parse_cpu_list(_fs.read_line(root, "/sys/devices/system/cpu/possible"))
    from_cpuinfo = sorted({n for b in blocks if (n := _fs.parse_int(b.get("processor"))) is not None})
    logical_cpus = possible or from_cpuinfo or (list(range(os.cpu_count() or 1)) if host else [])
    online = _fs.parse_cpu_list(_fs.read_line(root, "/sys/devices/system/cpu/online")) or logical_cpus
    limits = [len(online)] if online else []
    if host and hasattr(os, "sched_getaffinity"):
        limits.append(len(os.sched_getaffinity(0)))
    elif cgroup.get("cpuset_cpus"):
        limits.append(len(cgroup["cpuset_cpus"]))
    if cgroup.get("cpu_quota_cores"):
        limits.append(math.ceil(cgroup["cpu_quota_cores"]))
    facts = {
        "logical_cores": len(logical_cpus) or None,
        "online_cores": len(online) or None,
        "usable_cores": max(1, min(limits)) if limits else 1,
        "clusters": clusters(root, online),
        "features": features,
        "model_name": None if foreign else model_name(blocks, header),
    }
    return facts, arch


def _normalise_arch(machine: str) -> str | None:
    machine = machine.lower()
    return {"arm64": "aarch64", "amd64": "x86_64", "x64": "x86_64"}.get(machine, machine) or None
