"""How much memory a device can still give, checked before a large allocation (KV cache, host
tiers): an impossible request becomes a one-line error naming the option instead of minutes of
zero-filling that ends with the OOM killer."""
from __future__ import annotations

import os
from typing import Optional

import torch

_GiB = 1 << 30


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            s = f.read().strip()
        return None if s == "max" else int(s)
    except (OSError, ValueError):
        return None


def _cgroup_room() -> Optional[int]:
    """Bytes left under this process's cgroup memory limit (v2, then v1), None if unlimited."""
    for limit_f, usage_f in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                             ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                              "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit = _read_int(limit_f)
        if limit is not None and limit < (1 << 60):  # v1 writes "no limit" as a huge number
            return max(0, limit - (_read_int(usage_f) or 0))
    return None


def host_available_bytes() -> Optional[int]:
    """Host memory a new allocation can use without swapping (MemAvailable, capped by the cgroup)."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    room = _cgroup_room()
    return avail if room is None else min(avail, room)


def available_bytes(device) -> Optional[int]:
    """Free memory on `device` (None when it cannot be told)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        return host_available_bytes()
    return None


def fmt_bytes(n: float) -> str:
    return f"{n / _GiB:.2f} GiB" if n >= _GiB / 100 else f"{n / (1 << 20):.2f} MiB"


def check_fits(nbytes: float, device, what: str) -> None:
    """ValueError naming `what` when nbytes exceed the free memory of `device`."""
    device = torch.device(device)
    avail = available_bytes(device)
    if avail is not None and nbytes > avail:
        raise ValueError(f"{what}: needs {fmt_bytes(nbytes)}, but only {fmt_bytes(avail)} of {device.type} memory "
                         f"is available")
