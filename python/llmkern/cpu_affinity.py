"""Which CPUs this process runs on, and how co-located engines split a machine's cores.

Engines that share cores slow each other down more than their share (caches, memory bandwidth,
preemption at every kernel's join); giving each its own cores avoids that. Two ways:

- ``LLMKERN_CPUS=0-3,8`` in an engine process's environment: applied when llmkern is imported.
- ``llmkern.set_cpu_affinity(cpus)`` from Python.

``cpu_share(i, n)`` is replica i's part when n replicas (e.g. data-parallel engines) split the CPUs
this process may use; a launcher passes it on as ``LLMKERN_CPUS=format_cpus(cpu_share(i, n))``.
The kernels' thread count then follows (``llmkern.get_num_threads()``)."""
from __future__ import annotations

import os
from typing import Iterable, List, Optional


def parse_cpus(spec: str) -> List[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi or lo < 0:
                    raise ValueError
                cpus.update(range(lo, hi + 1))
            else:
                if int(part) < 0:
                    raise ValueError
                cpus.add(int(part))
        except ValueError:
            raise ValueError(f"cpus: expected a CPU list like '0-3,8', got {spec!r}") from None
    if not cpus:
        raise ValueError(f"cpus: expected a CPU list like '0-3,8', got {spec!r}")
    return sorted(cpus)


def format_cpus(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    cs = sorted(set(int(c) for c in cpus))
    out, i = [], 0
    while i < len(cs):
        j = i
        while j + 1 < len(cs) and cs[j + 1] == cs[j] + 1:
            j += 1
        out.append(str(cs[i]) if i == j else f"{cs[i]}-{cs[j]}")
        i = j + 1
    return ",".join(out)


def allowed_cpus() -> List[int]:
    """The CPUs this process may run on now."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cpu_share(index: int, count: int, cpus: Optional[Iterable[int]] = None) -> List[int]:
    """Replica `index`'s CPUs when `count` replicas split `cpus` (default: allowed_cpus()) into
    contiguous, near-equal parts. With more replicas than CPUs, replicas share CPUs round-robin."""
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count: expected an int >= 1, got {count!r}")
    if not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(f"index: expected an int in [0, {count}), got {index!r}")
    cs = sorted(set(cpus)) if cpus is not None else allowed_cpus()
    if not cs:
        raise ValueError("cpus: empty")
    if count >= len(cs):
        return [cs[index % len(cs)]]
    lo, hi = index * len(cs) // count, (index + 1) * len(cs) // count
    return cs[lo:hi]


def set_cpu_affinity(cpus, threads: Optional[int] = None) -> List[int]:
    """Run this process (all its threads: the kernels' pool, torch's, the caller's) on `cpus` (a
    list of ids or a string like '0-3,8') and size the kernels' and torch's thread counts to them
    (or to `threads`). Returns the CPUs applied. Call while no kernel is running."""
    import torch

    from . import _C

    cs = parse_cpus(cpus) if isinstance(cpus, str) else sorted(set(int(c) for c in cpus))
    if not cs:
        raise ValueError("cpus: expected at least one CPU")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads: expected an int >= 1, got {threads!r}")
    if not hasattr(os, "sched_setaffinity"):
        raise NotImplementedError("set_cpu_affinity: this platform has no sched_setaffinity")
    _C.pause_thread_placement(True)  # a worker moving itself meanwhile would restore its old mask
    try:
        _set_all_masks(cs)
    finally:
        _C.pause_thread_placement(False)
    quota = _C.build_info().get("cgroup_cpu_limit") or len(cs)
    n = threads or max(1, min(len(cs), quota))
    _C.set_num_threads(n)
    torch.set_num_threads(n)
    return cs


def _set_all_masks(cs: List[int]) -> None:
    try:
        os.sched_setaffinity(0, cs)
    except OSError as e:
        raise ValueError(f"cpus: cannot run on {format_cpus(cs)} ({e.strerror}); allowed: "
                         f"{format_cpus(allowed_cpus())}") from None
    try:  # the other threads of this process (the calling thread's mask alone does not move them)
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = []
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cs)
        except OSError:  # a thread that exited meanwhile
            pass


def apply_env() -> None:
    """LLMKERN_CPUS, if set: set_cpu_affinity at import."""
    spec = os.environ.get("LLMKERN_CPUS", "").strip()
    if spec:
        try:
            set_cpu_affinity(parse_cpus(spec))
        except ValueError as e:
            raise ValueError(f"LLMKERN_CPUS: {e}") from None
