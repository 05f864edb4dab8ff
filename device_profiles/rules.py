"""The ``[match]`` rules a catalogue entry may use, and the profile facts they test.

Each rule names one fact and a comparison: ``os = "android"`` (equal, or one
of a list), ``has_gpu = false`` (boolean), ``min_usable_cores = 4`` /
``max_memory_gib = 6`` (bounds), ``cpu_features = ["dotprod"]`` (all present).
"""

from __future__ import annotations

from typing import Any

GIB = float(1 << 30)

# rule name -> (fact name, comparison)
RULES: dict[str, tuple[str, str]] = {
    "os": ("os", "one_of"),
    "arch": ("arch", "one_of"),
    "gpu_vendor": ("gpu_vendor", "one_of"),
    "android": ("android", "bool"),
    "container": ("container", "bool"),
    "virtualized": ("virtualized", "bool"),
    "emulator": ("emulator", "bool"),
    "has_gpu": ("has_gpu", "bool"),
    "gpu_virtual": ("gpu_virtual", "bool"),
    "has_opencl": ("has_opencl", "bool"),
    "has_opencl_gpu": ("has_opencl_gpu", "bool"),
    "has_vulkan": ("has_vulkan", "bool"),
    "has_vulkan_gpu": ("has_vulkan_gpu", "bool"),
    "min_usable_cores": ("usable_cores", "min"),
    "max_usable_cores": ("usable_cores", "max"),
    "min_memory_gib": ("memory_gib", "min"),
    "max_memory_gib": ("memory_gib", "max"),
    "cpu_features": ("cpu_features", "all_of"),
}


def profile_facts(profile: dict) -> dict[str, Any]:
    """The facts rules test, derived from a ``probe()`` profile (missing parts read as absent)."""
    gpu = profile.get("gpu") or {}
    cl_devices = (profile.get("opencl") or {}).get("devices") or []
    vk_devices = (profile.get("vulkan") or {}).get("devices") or []
    container = profile.get("container") or {}
    android = profile.get("android")
    usable_bytes = (profile.get("memory") or {}).get("usable_bytes")
    return {
        "os": profile.get("os"),
        "arch": profile.get("arch"),
        "gpu_vendor": gpu.get("vendor"),
        "android": android is not None,
        "container": bool(container.get("in_container")),
        "virtualized": bool(container.get("virtualized")),
        "emulator": bool((android or {}).get("is_emulator")),
        "has_gpu": gpu.get("vendor") is not None,
        "gpu_virtual": bool(gpu.get("virtual")),
        "has_opencl": bool(cl_devices),
        "has_opencl_gpu": any(d.get("type") == "gpu" and not d.get("software") for d in cl_devices),
        "has_vulkan": bool(vk_devices),
        "has_vulkan_gpu": any(not d.get("software") for d in vk_devices),
        "usable_cores": (profile.get("cpu") or {}).get("usable_cores"),
        "memory_gib": usable_bytes / GIB if isinstance(usable_bytes, (int, float)) else None,
        "cpu_features": sorted((profile.get("cpu") or {}).get("features") or []),
    }


def rule_error(rule: str, expected: Any) -> str | None:
    """Why ``rule = expected`` is not a valid rule, or None when it is."""
    if rule not in RULES:
        return f"unknown match rule {rule!r}; known: {', '.join(sorted(RULES))}"
    comparison = RULES[rule][1]
    if comparison == "bool" and not isinstance(expected, bool):
        return f"rule {rule!r} expects true/false, got {expected!r}"
    if comparison in ("min", "max") and (isinstance(expected, bool) or not isinstance(expected, (int, float))):
        return f"rule {rule!r} expects a number, got {expected!r}"
    if comparison == "one_of" and not (isinstance(expected, str) or
                                       (isinstance(expected, list) and all(isinstance(v, str) for v in expected))):
        return f"rule {rule!r} expects a string or a list of strings, got {expected!r}"
    if comparison == "all_of" and not (isinstance(expected, list) and all(isinstance(v, str) for v in expected)):
        return f"rule {rule!r} expects a list of strings, got {expected!r}"
    return None


def check(rule: str, expected: Any, facts: dict[str, Any]) -> tuple[bool, str]:
    """``(held, explanation)`` of one valid rule against the facts."""
    fact, comparison = RULES[rule]
    got = facts.get(fact)
    shown = "unknown" if got is None else _show(got)
    if comparison == "one_of":
        allowed = [expected] if isinstance(expected, str) else list(expected)
        return got in allowed, f"{fact} is {' or '.join(map(repr, allowed))} (probe: {shown})"
    if comparison == "bool":
        return bool(got) == expected, f"{fact} is {_show(expected)} (probe: {shown})"
    if comparison == "all_of":
        return set(expected) <= set(got or []), f"{fact} include {', '.join(expected)} (probe: {shown})"
    if got is None:
        return False, f"{fact} {'>=' if comparison == 'min' else '<='} {expected} (probe: unknown)"
    held = got >= expected if comparison == "min" else got <= expected
    return held, f"{fact} {'>=' if comparison == 'min' else '<='} {expected} (probe: {shown})"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return repr(value)
