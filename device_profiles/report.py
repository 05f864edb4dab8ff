"""Human-readable text of a profile and its match (``edge-runtime probe`` without ``--json``)."""

from __future__ import annotations

from device_profiles.catalog import ProfileMatch

GIB = float(1 << 30)


def _gib(value: int | None) -> str:
    return "unknown" if value is None else f"{value / GIB:.1f} GiB"


def _device_line(device: dict) -> str:
    kind = device.get("type") or "?"
    software = ", software" if device.get("software") else ""
    where = f" on {device['platform']}" if device.get("platform") else ""
    return f"{device.get('name')} [{kind}{software}]{where}"


def _system_lines(profile: dict) -> list[str]:
    lines = [f"device:     {profile.get('arch') or 'unknown arch'} {profile.get('os')}"
             + (f", kernel {profile['kernel']}" if profile.get("kernel") else "")]
    android = profile.get("android")
    if android:
        lines.append(f"android:    {android.get('release')} (sdk {android.get('sdk')}), "
                     f"{android.get('manufacturer')} {android.get('model')}, platform {android.get('platform')}"
                     + (", emulator" if android.get("is_emulator") else ""))
    cpu = profile.get("cpu") or {}
    clusters = ", ".join(f"{len(c['cpus'])}x @ {c['max_freq_khz'] / 1e6:.2f} GHz" if c.get("max_freq_khz")
                         else f"{len(c['cpus'])}x" for c in cpu.get("clusters") or [])
    lines.append(f"cpu:        {cpu.get('model_name') or 'unknown'}; {cpu.get('logical_cores')} logical, "
                 f"{cpu.get('online_cores')} online, {cpu.get('usable_cores')} usable; clusters {clusters or '-'}")
    lines.append(f"features:   {' '.join(cpu.get('features') or []) or '-'}")
    memory, cgroup = profile.get("memory") or {}, profile.get("cgroup") or {}
    quota = cgroup.get("cpu_quota_cores")
    lines.append(f"memory:     total {_gib(memory.get('total_bytes'))}, available {_gib(memory.get('available_bytes'))}, "
                 f"usable {_gib(memory.get('usable_bytes'))}")
    lines.append(f"cgroup:     v{cgroup.get('version') or '-'}, cpu quota "
                 f"{'none' if quota is None else f'{quota:g} cores'}, memory limit "
                 f"{'none' if cgroup.get('memory_limit_bytes') is None else _gib(cgroup['memory_limit_bytes'])}")
    container = profile.get("container") or {}
    evidence = (container.get("markers") or []) + (container.get("vm_markers") or [])
    lines.append(f"container:  {'yes' if container.get('in_container') else 'no'}"
                 + (f" ({'; '.join(evidence)})" if evidence else ""))
    return lines


def _accelerator_lines(profile: dict) -> list[str]:
    gpu = profile.get("gpu") or {}
    lines = [f"gpu:        {gpu.get('vendor') or 'none'}" + (" (virtual)" if gpu.get("virtual") else "")
             + (f", {gpu['name']}" if gpu.get("name") else "")]
    opencl = profile.get("opencl") or {}
    cl_devices = "; ".join(_device_line(d) for d in opencl.get("devices") or []) or "none"
    lines.append(f"opencl:     {cl_devices} (from {opencl.get('source')})")
    if opencl.get("icd_hint"):
        lines.append(f"            hint: {opencl['icd_hint']}")
    vulkan = profile.get("vulkan") or {}
    vk_devices = "; ".join(_device_line(d) for d in vulkan.get("devices") or []) or "none"
    lines.append(f"vulkan:     {vk_devices} (from {vulkan.get('source')})")
    delegates = ", ".join(f"{d['path']} ({d['kind']})" for d in profile.get("tflite_delegates") or [])
    lines.append(f"delegates:  {delegates or 'none'}")
    load = profile.get("load_sources") or {}
    busy = load.get("gpu_busy")
    zones = [z for z in load.get("thermal_zones") or [] if z.get("temp_c") is not None]
    hottest = max(zones, key=lambda z: z["temp_c"], default=None)
    lines.append(f"load:       gpu busy {busy['path'] + ' (' + busy['kind'] + ')' if busy else 'unavailable'}; "
                 f"{len(load.get('thermal_zones') or [])} thermal zones"
                 + (f", hottest {hottest['type']} {hottest['temp_c']:.1f} C" if hottest else ""))
    return lines


def format_profile(profile: dict, match: ProfileMatch | None) -> str:
    """A few aligned lines describing the device and, when given, the matched catalogue entry."""
    lines = _system_lines(profile) + _accelerator_lines(profile)
    if match is not None:
        lines.append(f"profile:    {match.name}; backends {' > '.join(match.backend_order)}")
        lines += [f"  - {reason}" for reason in match.reasons]
    return "\n".join(lines)
