"""Fault a CPU KV cache's pages in before the first request.

The CPU cache is an anonymous mapping advised for huge pages (models/hugepages.py): a page is
allocated and zeroed at its first write. Left lazy, a server's first pass through its KV pool pays
for that inside reshape_and_cache, on requests' critical path: measured on a 2-core Zen 4 KVM guest
(THP defrag "madvise", so each fault may compact memory) ~2.6 ms per 2 MiB page, a prefill of
8 x 256 tokens 3.2 s with lazy pages and 2.65 s with the pages present. vLLM zero-fills its cache
at start-up; here MADV_POPULATE_WRITE (Linux >= 5.14) makes the same faults without writing
anything (a block already written keeps its contents). A server does it before it answers
/health (a background thread at idle priority was tried first: its compaction and zeroing still
slowed the first requests' steps). Where the call is missing the cache simply stays lazy."""
from __future__ import annotations

import ctypes
import logging
import os
import time
from typing import List, Optional

import torch

log = logging.getLogger("llmkern.kvcache")

MADV_POPULATE_WRITE = 23
PAGE = 4096


def _madvise():
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def populate(tensors: List[torch.Tensor]) -> Optional[str]:
    """Make the pages of these CPU tensors resident (contents unchanged). Returns why it did not,
    or None. ctypes releases the GIL during the call, so a server's other threads keep running."""
    madvise = _madvise()
    if madvise is None:
        return "madvise unavailable"
    t0, nbytes = time.perf_counter(), 0
    for t in tensors:
        if t.device.type != "cpu" or not t.numel() or not t.is_contiguous():
            continue
        start = t.data_ptr() // PAGE * PAGE
        end = t.data_ptr() + t.numel() * t.element_size()
        if madvise(start, end - start, MADV_POPULATE_WRITE) != 0:
            # EINVAL: a kernel without MADV_POPULATE_WRITE; the cache stays lazy.
            why = os.strerror(ctypes.get_errno())
            log.info("llmkern: KV cache pages stay lazy (%s)", why)
            return why
        nbytes += end - start
    log.info("llmkern: KV cache pages faulted in (%.2f GiB in %.1f s)", nbytes / 2**30, time.perf_counter() - t0)
    return None
