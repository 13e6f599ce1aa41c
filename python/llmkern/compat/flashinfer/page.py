"""``flashinfer.page`` (FlashInfer 0.6.x): writing new tokens into a paged KV cache and the index
helpers that go with it, in torch ops (device work only, no host sync: safe to capture)."""
from __future__ import annotations

from typing import Optional

import torch

from ..._args import int_arg, require_tensor
from ._common import check_layout, unpack_paged

__all__ = ["append_paged_kv_cache", "get_batch_indices_positions", "get_seq_lens"]


def get_seq_lens(kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:
    """Keys per sequence: ``(pages - 1) * page_size + last_page_len`` (0 for a sequence without pages)."""
    page_size = int_arg(page_size, "page_size", 1)
    pages = kv_indptr[1:] - kv_indptr[:-1]
    return torch.where(pages > 0, (pages - 1).clamp(min=0) * page_size + kv_last_page_len, 0)


def get_batch_indices_positions(append_indptr: torch.Tensor, seq_lens: torch.Tensor, nnz: int):
    """For each of the ``nnz`` appended tokens: (its sequence, its position there). Sequence b's
    new tokens are rows ``append_indptr[b]:append_indptr[b+1]`` and end at ``seq_lens[b]``
    (the length after appending). Both int32 ``[nnz]``."""
    nnz = int_arg(nnz, "nnz", 0)
    counts = (append_indptr[1:] - append_indptr[:-1]).long()
    batch = torch.repeat_interleave(torch.arange(counts.numel(), device=append_indptr.device), counts,
                                    output_size=nnz)
    rank = torch.arange(nnz, device=append_indptr.device) - append_indptr[:-1].long()[batch]
    pos = seq_lens.long()[batch] - counts[batch] + rank
    return batch.to(torch.int32), pos.to(torch.int32)


def append_paged_kv_cache(append_key: torch.Tensor, append_value: torch.Tensor, batch_indices: torch.Tensor,
                          positions: torch.Tensor, paged_kv_cache, kv_indices: torch.Tensor,
                          kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, kv_layout: str = "NHD",
                          enable_pdl: Optional[bool] = None) -> None:
    """Writes ``append_key`` / ``append_value [nnz, Hkv, D]`` into the paged cache (NHD or HND, one
    tensor or a (k, v) pair) in place: token t goes to sequence ``batch_indices[t]`` at
    ``positions[t]``, i.e. page ``kv_indices[kv_indptr[b] + pos // page_size]``, slot
    ``pos % page_size``."""
    for t, name in ((append_key, "append_key"), (append_value, "append_value")):
        require_tensor(t, name, 3, "[nnz, num_kv_heads, head_dim]")
    k_cache, v_cache = unpack_paged(paged_kv_cache, check_layout(kv_layout))
    page_size = k_cache.shape[1]
    b = batch_indices.long()
    pos = positions.long()
    page = kv_indices.long()[kv_indptr.long()[b] + pos // page_size]
    off = pos % page_size
    k_cache[page, off] = append_key.to(k_cache.dtype)
    v_cache[page, off] = append_value.to(v_cache.dtype)
