"""plan(): FlashInfer's page lists (``kv_indptr`` / ``kv_indices`` / ``kv_last_page_len``) turned,
on the host, into what llmkern's kernels take: a block table ``[batch, max_pages]`` and per-sequence
key counts. run() then only launches kernels on these device tensors.

CUDA graphs: with ``use_cuda_graph=True`` the tensors keep their storage from one plan() to the
next (rewritten in place), so a graph captured on one plan replays with the next one's values;
the batch size and the width of the block table (the indices buffer's length) stay fixed, as
FlashInfer requires."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch

from ..._args import int_arg, require_tensor


def host_ints(t, name: str) -> torch.Tensor:
    """An index tensor read to the host as int64 (plan() may synchronise, as FlashInfer's does)."""
    require_tensor(t, name)
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: expected an int32 tensor, got {t.dtype}")
    return t.detach().to("cpu", torch.int64).reshape(-1)


def indptr_lengths(indptr: torch.Tensor, name: str) -> torch.Tensor:
    if indptr.numel() < 1:
        raise ValueError(f"{name}: needs at least one entry (batch_size + 1)")
    lens = indptr[1:] - indptr[:-1]
    if (lens < 0).any() or int(indptr[0]) < 0:
        raise ValueError(f"{name}: must be non-decreasing from a non-negative start")
    return lens


@dataclass
class PagedPlan:
    block_table: torch.Tensor   # int32 [batch, width]
    kv_lens: torch.Tensor       # int32 [batch]
    cu_kv: torch.Tensor         # int32 [batch + 1]
    kv_lens_host: torch.Tensor  # int64 [batch]
    max_kv: int
    page_size: int


def plan_paged(kv_indptr, kv_indices, kv_last_page_len, page_size, device,
               width: Optional[int] = None) -> PagedPlan:
    page_size = int_arg(page_size, "page_size", 1)
    indptr = host_ints(kv_indptr, "kv_indptr")
    indices = host_ints(kv_indices, "kv_indices")
    last = host_ints(kv_last_page_len, "kv_last_page_len")
    pages = indptr_lengths(indptr, "kv_indptr")
    batch = pages.numel()
    if last.numel() < batch:
        raise ValueError(f"kv_last_page_len: needs {batch} entries, got {last.numel()}")
    last = last[:batch]
    if int(indptr[-1]) > indices.numel():
        raise ValueError(f"kv_indices: kv_indptr ends at {int(indptr[-1])} but there are {indices.numel()} indices")
    if ((pages > 0) & ((last < 1) | (last > page_size))).any() or ((pages == 0) & (last != 0)).any():
        raise ValueError(f"kv_last_page_len: each entry must be in [1, page_size={page_size}] "
                         "(0 for a sequence without pages)")
    kv_lens = torch.where(pages > 0, (pages - 1) * page_size + last, torch.zeros_like(pages))
    cols = int(pages.max()) if batch else 0
    if width is not None:
        if cols > width:
            raise ValueError(f"kv_indptr: a sequence has {cols} pages, over the {width} the buffers hold")
        cols = width
    table = torch.zeros((batch, max(cols, 1)), dtype=torch.int64)
    if batch and int(indptr[-1]) > int(indptr[0]):
        rows = torch.repeat_interleave(torch.arange(batch), pages)
        col = torch.arange(rows.numel()) - torch.repeat_interleave(indptr[:-1] - indptr[0], pages)
        table[rows, col] = indices[int(indptr[0]):int(indptr[-1])]
    cu = torch.zeros(batch + 1, dtype=torch.int64)
    torch.cumsum(kv_lens, 0, out=cu[1:])
    return PagedPlan(table.to(device, torch.int32), kv_lens.to(device, torch.int32), cu.to(device, torch.int32),
                     kv_lens, int(kv_lens.max()) if batch else 0, page_size)


def keep_storage(slots: Dict[str, torch.Tensor], name: str, new: torch.Tensor, fixed: bool) -> torch.Tensor:
    """For CUDA-graph wrappers: the first plan's tensor, rewritten with the new values (same shape
    required); otherwise the new tensor."""
    old = slots.get(name)
    if not fixed or old is None:
        slots[name] = new
        return new
    if old.shape != new.shape:
        raise ValueError(f"{name}: shape {tuple(new.shape)} differs from the captured {tuple(old.shape)} "
                         "(a CUDA-graph wrapper keeps its batch size)")
    old.copy_(new, non_blocking=True)
    return old


def rope_gather_index(kv_lens_host: torch.Tensor, table_host: torch.Tensor, page_size: int):
    """For positional encodings applied on the fly: (page, offset, position) of every key, in
    sequence order, so run() can gather a ragged dense K/V to rotate."""
    batch = kv_lens_host.numel()
    seq = torch.repeat_interleave(torch.arange(batch), kv_lens_host)
    starts = torch.cumsum(kv_lens_host, 0) - kv_lens_host
    pos = torch.arange(seq.numel()) - torch.repeat_interleave(starts, kv_lens_host)
    page = table_host[seq, pos // page_size] if seq.numel() else torch.zeros(0, dtype=torch.int64)
    return page, pos % page_size, pos
