"""Paged attention of one layer over a mixed batch: decode rows first, then prefill rows.

The batch's token rows are laid out [decode tokens (one per sequence) | prefill chunks]. Per layer:
the new K/V rows go into the paged cache (reshape_and_cache_flash), decode rows attend through
flash_attn_with_kvcache and prefill chunks through flash_attn_varlen_func (paged when a chunk
continues a cached prefix, dense on the fresh K/V otherwise)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from ..ops.attention import flash_attn_varlen_func, flash_attn_with_kvcache
from ..ops.kvcache import reshape_and_cache_flash


@dataclass
class AttnMetadata:
    slot_mapping: torch.Tensor                       # [T] cache slot of every token row
    num_decode: int = 0                              # decode rows (first rows of the batch)
    decode_seqlens: Optional[torch.Tensor] = None    # int32 [num_decode] tokens in cache incl. new
    decode_block_table: Optional[torch.Tensor] = None  # int32 [num_decode, max_blocks]
    num_prefill_tokens: int = 0
    prefill_cu_q: Optional[torch.Tensor] = None      # int32 [num_prefill + 1]
    prefill_cu_k: Optional[torch.Tensor] = None      # int32 [num_prefill + 1] (paged: context + new)
    prefill_max_q: int = 0
    prefill_max_k: int = 0
    prefill_block_table: Optional[torch.Tensor] = None  # None: all chunks start at 0 (dense path)


def _as_batch(x: torch.Tensor) -> torch.Tensor:
    """[n, H, D] rows -> [n, 1, H, D] whose length-1 dim carries the row stride (kernels may walk
    rows as b * s + i with the seq-dim stride, which plain unsqueeze(1) would set differently)."""
    return x.as_strided((x.shape[0], 1) + tuple(x.shape[1:]), (x.stride(0), x.stride(0)) + tuple(x.stride()[1:]))


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttnMetadata, scale: float,
                    window: Tuple[int, int], out: torch.Tensor) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D] (head_dim contiguous); writes and returns out [T, H, D]."""
    reshape_and_cache_flash(k, v, k_cache, v_cache, meta.slot_mapping)
    nd = meta.num_decode
    if nd:
        flash_attn_with_kvcache(
            _as_batch(q[:nd]), k_cache, v_cache, cache_seqlens=meta.decode_seqlens,
            block_table=meta.decode_block_table, softmax_scale=scale, causal=True,
            window_size=window, out=_as_batch(out[:nd]))
    if meta.num_prefill_tokens:
        if meta.prefill_block_table is None:
            flash_attn_varlen_func(
                q[nd:], k[nd:], v[nd:], meta.prefill_cu_q, meta.prefill_cu_q, meta.prefill_max_q,
                meta.prefill_max_q, softmax_scale=scale, causal=True, window_size=window, out=out[nd:])
        else:
            flash_attn_varlen_func(
                q[nd:], k_cache, v_cache, meta.prefill_cu_q, meta.prefill_cu_k, meta.prefill_max_q,
                meta.prefill_max_k, softmax_scale=scale, causal=True, window_size=window,
                block_table=meta.prefill_block_table, out=out[nd:])
    return out
