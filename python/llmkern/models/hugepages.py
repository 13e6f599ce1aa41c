"""CPU weights and KV caches on transparent huge pages.

Decode on CPU streams every weight once per step. With 4 KiB pages the hardware prefetchers stop at
every page boundary and each page costs a TLB miss: measured here, the decode GEMV reads weights
at ~25 GB/s from ordinary pages and ~34 GB/s (the machine's read bandwidth) from 2 MiB pages.
Linux hands out huge pages for anonymous memory advised with MADV_HUGEPAGE (THP "madvise" mode,
the common default); elsewhere this falls back to ordinary memory."""
from __future__ import annotations

import mmap
from typing import Dict, List, Optional

import torch

_ALIGN = 4096  # bytes; every tensor starts on its own cache lines (and page when large)


_MADV_COLLAPSE = getattr(mmap, "MADV_COLLAPSE", 25)  # Linux >= 6.1; Python < 3.12 lacks the name


def _arena(nbytes: int, collapse: bool = False):
    """(zero-filled uint8 tensor of nbytes backed by an anonymous mapping advised for huge pages,
    a function that makes its filled pages huge)."""
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            m.madvise(advice)
        except OSError:  # THP disabled ("never"): ordinary pages
            pass

    def collapse_now() -> None:
        # A huge page is allocated at the first touch only when a free 2 MiB block is at hand;
        # on a fragmented machine part of the weights lands on 4 KiB pages and decode reads those
        # ~25% slower, differently from one process to the next. MADV_COLLAPSE compacts and
        # collapses what was missed, synchronously (an error where unsupported: nothing to do).
        try:
            m.madvise(_MADV_COLLAPSE)
        except (OSError, ValueError):
            pass

    return torch.frombuffer(m, dtype=torch.uint8), collapse_now


def move_to_hugepages(tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    """Copies of CPU tensors, packed into one huge-page arena (the same input tensor object, e.g.
    tied embeddings, maps to the same copy). Other tensors are returned as they are."""
    if not hasattr(mmap, "MAP_ANONYMOUS"):
        return list(tensors)
    offsets: Dict[int, int] = {}
    total = 0
    for t in tensors:
        if t is None or t.device.type != "cpu" or id(t) in offsets:
            continue
        offsets[id(t)] = total
        total += (t.numel() * t.element_size() + _ALIGN - 1) // _ALIGN * _ALIGN
    if total == 0:
        return list(tensors)
    arena, collapse = _arena(total)
    out, done = [], {}
    for t in tensors:
        if t is None or id(t) not in offsets:
            out.append(t)
            continue
        if id(t) not in done:
            o = offsets[id(t)]
            n = t.numel() * t.element_size()
            dst = arena[o:o + n].view(t.dtype).view(t.shape)
            dst.copy_(t)
            done[id(t)] = dst
        out.append(done[id(t)])
    collapse()
    return out


def zeros_on_hugepages(shapes: List[tuple], dtype: torch.dtype) -> List[torch.Tensor]:
    """Zero-filled CPU tensors of the given shapes in one huge-page arena (pages are faulted in on
    first touch). Paged KV caches: decode attention reads each sequence's blocks in table order,
    scattered over the cache, and on 4 KiB pages pays a TLB miss and a prefetcher restart per page."""
    esize = torch.empty((), dtype=dtype).element_size()
    sizes = [(int(torch.Size(s).numel()) * esize + _ALIGN - 1) // _ALIGN * _ALIGN for s in shapes]
    if not hasattr(mmap, "MAP_ANONYMOUS") or sum(sizes) == 0:
        return [torch.zeros(s, dtype=dtype) for s in shapes]
    arena, _ = _arena(sum(sizes))
    out, o = [], 0
    for s, n in zip(shapes, sizes):
        numel = int(torch.Size(s).numel())
        out.append(arena[o:o + numel * esize].view(dtype).view(s))
        o += n
    return out


def mapping_kib(t: torch.Tensor) -> Dict[str, int]:
    """The KiB fields (Rss, AnonHugePages, ...) of /proc/self/smaps for the mapping that holds t
    (adjacent arenas may share one mapping); empty where unknown."""
    ptr, inside, out = t.data_ptr(), False, {}
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    if out:
                        break
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo <= ptr < hi
                elif inside and head.endswith(":") and line.rstrip().endswith(" kB"):
                    out[head[:-1]] = int(line.split()[1])
    except (OSError, ValueError):
        return {}
    return out


def hugepage_fraction(t: torch.Tensor) -> Optional[float]:
    """Fraction of the resident memory of the mapping that holds t which is on huge pages
    (AnonHugePages / Rss); None where unknown."""
    kib = mapping_kib(t)
    return kib["AnonHugePages"] / kib["Rss"] if kib.get("Rss") and "AnonHugePages" in kib else None
