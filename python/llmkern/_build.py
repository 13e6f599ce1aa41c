"""What this build holds and how many threads the CPU kernels use (re-exported by llmkern)."""
from __future__ import annotations

import platform

from . import _C
from ._backend import simt_available


def build_info() -> dict:
    """What this build contains and what the running machine offers.

    Keys: version, backends (compiled), cuda_compiled, cuda_archs, cuda_toolkit (the CUDA version
    that built the kernels, "" without CUDA), cuda_sass / cuda_ptx (architectures with machine code /
    with PTX the driver compiles for newer GPUs, comma-separated), cuda_device_count,
    cpu_simd (level in use), cpu_simd_supported, cpu_simd_compiled, cpu_amx ("hardware", "emulated"
    or "off"), cpu_kernels (the instructions each CPU kernel family runs on), num_threads, threads ("pool"
    or "openmp": what runs the CPU kernels' parallel loops, see csrc/common/thread_pool.h),
    threads_compiled (the modes this build has: wheels are built without OpenMP),
    available_cpus (affinity mask capped by the cgroup CPU quota), cgroup_cpu_limit (0: none), simt (whether the emulated-CUDA test backend llmkern._simt is installed)."""
    info = dict(_C.build_info())
    info["backends"] = list(info["backends"])
    info["cpu_simd_compiled"] = list(info["cpu_simd_compiled"])
    info["threads_compiled"] = list(info["threads_compiled"])
    info["simt"] = simt_available()
    return info


def set_num_threads(n: int) -> None:
    """Threads used by the CPU kernels (default: OMP_NUM_THREADS, else the CPUs this process may
    run on: its affinity mask, capped by its cgroup's CPU quota). Call it while no kernel is
    running. To split cores between engines see set_cpu_affinity / LLMKERN_CPUS."""
    _C.set_num_threads(int(n))


def get_num_threads() -> int:
    return _C.get_num_threads()


def _cpuinfo_fields(name: str) -> list:
    """The values of /proc/cpuinfo's first `name` line, split on whitespace ([] where unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].split() for line in f if line.split(":", 1)[0].strip() == name), [])
    except OSError:
        return []


def cpu_model() -> str:
    """The CPU's model name (lscpu's "Model name"), or what the platform says where Linux does not."""
    return " ".join(_cpuinfo_fields("model name")) or platform.processor() or platform.machine()


# The CPU features the kernels' paths depend on, as /proc/cpuinfo names them.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_flags() -> list:
    """Which of CPU_FLAGS this CPU has."""
    flags = set(_cpuinfo_fields("flags"))
    return [f for f in CPU_FLAGS if f in flags]
