"""Fake device filesystems (procfs, sysfs, Android build files) built under a tmp_path.

Each builder writes what a real device of that kind exposes, in the kernel's
own formats, and returns the root. Values are chosen by hand so tests can
compute the expected facts from them.
"""

from __future__ import annotations

from pathlib import Path

GIB = 1 << 30

ARM_FEATURES_8GEN1 = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt "
                      "fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 asimdfhm dit uscat ilrcpc flagm ssbs sb "
                      "paca pacg dcpodp flagm2 frint i8mm bf16 bti")
ARM_FEATURES_TENSOR = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
ARM_FEATURES_N1 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs"


def write(root: Path, device_path: str, text: str) -> Path:
    path = root / device_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def arm_cpuinfo(parts: list[int], features: str) -> str:
    """``/proc/cpuinfo`` of an arm64 kernel: one block per core, ``parts[i]`` = CPU part of core i."""
    blocks = [f"processor\t: {i}\nBogoMIPS\t: 38.40\nFeatures\t: {features}\nCPU implementer\t: 0x41\n"
              f"CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0x{part:03x}\nCPU revision\t: 0\n"
              for i, part in enumerate(parts)]
    return "\n".join(blocks)


def meminfo(total_bytes: int, available_bytes: int) -> str:
    return (f"MemTotal:       {total_bytes // 1024} kB\nMemFree:        {available_bytes // 2048} kB\n"
            f"MemAvailable:   {available_bytes // 1024} kB\nBuffers:           1024 kB\n")


def cpus(root: Path, count: int, max_freqs_khz: list[int] | None = None) -> None:
    """present/online lists and, when given, per-core ``cpuinfo_max_freq``."""
    write(root, "/sys/devices/system/cpu/present", f"0-{count - 1}\n")
    write(root, "/sys/devices/system/cpu/possible", f"0-{count - 1}\n")
    write(root, "/sys/devices/system/cpu/online", f"0-{count - 1}\n")
    for cpu, freq in enumerate(max_freqs_khz or []):
        write(root, f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq", f"{freq}\n")


def props(root: Path, device_path: str, values: dict[str, str]) -> None:
    write(root, device_path, "# begin build properties\n" + "".join(f"{k}={v}\n" for k, v in values.items()))


def adreno_phone(root: Path) -> Path:
    """A Snapdragon 8 Gen 1 phone: 4x A510 @1.79 + 3x A710 @2.50 + 1x X2 @3.00 GHz, Adreno 730, 12 GiB."""
    write(root, "/proc/cpuinfo", arm_cpuinfo([0xD46] * 4 + [0xD47] * 3 + [0xD48], ARM_FEATURES_8GEN1))
    cpus(root, 8, [1785600] * 4 + [2496000] * 3 + [2995200])
    write(root, "/proc/meminfo", meminfo(12 * GIB, 5 * GIB))
    write(root, "/proc/sys/kernel/osrelease", "5.10.136-android12-9-00001-g1234567\n")
    props(root, "/system/build.prop", {
        "ro.build.version.release": "13", "ro.build.version.sdk": "33", "ro.product.model": "SM-S901B",
        "ro.product.manufacturer": "samsung", "ro.product.board": "taro", "ro.board.platform": "taro",
        "ro.hardware": "qcom",
        "ro.build.fingerprint": "samsung/r0sxxx/r0s:13/TP1A.220624.014/S901BXXU2BVJA:user/release-keys"})
    props(root, "/vendor/build.prop", {"ro.hardware.egl": "adreno", "ro.soc.model": "SM8450",
                                       "ro.product.model": "vendor-model-must-not-win"})
    write(root, "/sys/class/kgsl/kgsl-3d0/gpubusy", "    1200     4000\n")
    write(root, "/sys/class/kgsl/kgsl-3d0/gpu_busy_percentage", "30 %\n")
    write(root, "/sys/class/kgsl/kgsl-3d0/gpu_model", "Adreno730v2\n")
    write(root, "/vendor/lib64/libOpenCL.so", "")
    write(root, "/vendor/lib64/libhexagon_delegate.so", "")
    write(root, "/sys/class/thermal/thermal_zone0/type", "cpu-0-0-usr\n")
    write(root, "/sys/class/thermal/thermal_zone0/temp", "41300\n")
    write(root, "/sys/class/thermal/thermal_zone0/trip_point_1_temp", "115000\n")
    write(root, "/sys/class/thermal/thermal_zone0/trip_point_0_temp", "95000\n")
    write(root, "/sys/class/thermal/thermal_zone10/type", "gpuss-0-usr\n")
    write(root, "/sys/class/thermal/thermal_zone10/temp", "38700\n")
    write(root, "/sys/fs/cgroup/cgroup.controllers", "cpu io memory\n")
    write(root, "/proc/self/cgroup", "0::/uid_10234/pid_5678\n")
    write(root, "/dev/binder", "")
    return root


def mali_phone(root: Path, *, delegate: bool = True, opencl: bool = True) -> Path:
    """A Tensor G2 phone: 4x A55 + 2x A76 + 2x X1, Mali-G710, 8 GiB."""
    write(root, "/proc/cpuinfo", arm_cpuinfo([0xD05] * 4 + [0xD0B] * 2 + [0xD44] * 2, ARM_FEATURES_TENSOR))
    cpus(root, 8, [1803000] * 4 + [2348000] * 2 + [2850000] * 2)
    write(root, "/proc/meminfo", meminfo(8 * GIB, 3 * GIB))
    props(root, "/system/build.prop", {
        "ro.build.version.release": "14", "ro.build.version.sdk": "34", "ro.product.model": "Pixel 7",
        "ro.product.manufacturer": "Google", "ro.board.platform": "gs201", "ro.hardware": "panther"})
    props(root, "/vendor/build.prop", {"ro.hardware.egl": "mali"})
    (root / "sys/class/misc/mali0").mkdir(parents=True)
    write(root, "/sys/devices/platform/1c500000.mali/utilization", "55\n")
    if opencl:
        write(root, "/vendor/lib64/egl/libGLES_mali.so", "")
        write(root, "/vendor/lib64/libOpenCL-pixel.so", "")
    if delegate:
        write(root, "/vendor/lib64/libvulkan_delegate.so", "")
    return root


def redroid_container(root: Path, *, cgroup: str = "v2", cpu_max: str = "200000 100000",
                      memory_max: str = str(4 * GIB), own_path: str = "/") -> Path:
    """redroid (Android in docker) on a 64-core, 256 GiB arm64 host; cgroup limits as given."""
    write(root, "/proc/cpuinfo", arm_cpuinfo([0xD0C] * 64, ARM_FEATURES_N1))
    cpus(root, 64, [3000000] * 64)
    write(root, "/proc/meminfo", meminfo(256 * GIB, 200 * GIB))
    write(root, "/.dockerenv", "")
    props(root, "/system/build.prop", {
        "ro.build.version.release": "13", "ro.build.version.sdk": "33", "ro.product.model": "redroid13_arm64",
        "ro.product.manufacturer": "redroid", "ro.hardware": "redroid"})
    props(root, "/vendor/build.prop", {"ro.hardware.egl": "angle", "ro.hardware.vulkan": "pastel"})
    write(root, "/system/lib64/libvulkan.so", "")
    write(root, "/vendor/lib64/hw/vulkan.pastel.so", "")
    if cgroup == "v2":
        write(root, "/proc/self/cgroup", f"0::{own_path}\n")
        write(root, "/sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n")
        base = "/sys/fs/cgroup" + ("" if own_path == "/" else own_path)
        write(root, f"{base}/cpu.max", cpu_max + "\n")
        write(root, f"{base}/memory.max", memory_max + "\n")
        write(root, f"{base}/memory.current", f"{GIB}\n")
    return root


def cgroup_v1(root: Path, *, quota_us: int, period_us: int, memory_limit: int) -> Path:
    """cgroup v1 files as docker writes them (combined ``cpu,cpuacct`` hierarchy)."""
    write(root, "/proc/self/cgroup", "5:memory:/\n4:cpuset:/\n3:cpu,cpuacct:/\n0::/\n")
    write(root, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", f"{quota_us}\n")
    write(root, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", f"{period_us}\n")
    write(root, "/sys/fs/cgroup/memory/memory.limit_in_bytes", f"{memory_limit}\n")
    write(root, "/sys/fs/cgroup/memory/memory.usage_in_bytes", f"{GIB // 2}\n")
    return root


def vgpu_phone(root: Path, *, delegate: bool = False) -> Path:
    """A cloud phone VM with virtio-gpu (venus Vulkan, mesa EGL): 4 vCPU, 8 GiB."""
    write(root, "/proc/cpuinfo", arm_cpuinfo([0xD0C] * 4, ARM_FEATURES_N1))
    cpus(root, 4)
    write(root, "/proc/meminfo", meminfo(8 * GIB, 6 * GIB))
    props(root, "/system/build.prop", {
        "ro.build.version.release": "12", "ro.build.version.sdk": "32", "ro.product.model": "CloudPhone",
        "ro.product.manufacturer": "example-cloud"})
    props(root, "/vendor/build.prop", {"ro.hardware.egl": "mesa", "ro.hardware.vulkan": "virtio"})
    write(root, "/sys/class/drm/card0/device/uevent", "DRIVER=virtio_gpu\nPCI_CLASS=30000\n")
    write(root, "/system/lib64/libvulkan.so", "")
    write(root, "/vendor/lib64/hw/vulkan.virtio.so", "")
    if delegate:
        write(root, "/vendor/lib64/libtensorflowlite_gpu_delegate.so", "")
    return root


def x86_dev_box(root: Path) -> Path:
    """A 4-core x86-64 Linux box with PoCL registered through the ICD loader, no GPU."""
    flags = "fpu vme de pse tsc msr pae cx8 sse sse2 ht syscall nx lm sse4_1 sse4_2 avx f16c fma avx2 avx512f"
    write(root, "/proc/cpuinfo", "\n".join(f"processor\t: {i}\nmodel name\t: Example CPU @ 3.0GHz\n"
                                          f"flags\t\t: {flags}\n" for i in range(4)))
    cpus(root, 4)
    write(root, "/proc/meminfo", meminfo(16 * GIB, 12 * GIB))
    write(root, "/etc/OpenCL/vendors/pocl.icd", "libpocl.so.2\n")
    write(root, "/usr/lib/x86_64-linux-gnu/libOpenCL.so.1", "")
    return root


def vulkan_only_phone(root: Path) -> Path:
    """The Snapdragon phone above without libOpenCL.so, with the Adreno Vulkan HAL driver."""
    adreno_phone(root)
    (root / "vendor/lib64/libOpenCL.so").unlink()
    write(root, "/system/lib64/libvulkan.so", "")
    write(root, "/vendor/lib64/hw/vulkan.adreno.so", "")
    return root
