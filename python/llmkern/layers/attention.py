"""Paged attention of one layer over a mixed batch: decode rows first, then prefill rows.

The batch's token rows are laid out [decode tokens (one per sequence) | prefill chunks]. Per layer:
the new K/V rows go into the paged cache (reshape_and_cache_flash), decode rows attend through
flash_attn_with_kvcache and prefill chunks through flash_attn_varlen_func (paged when a chunk
continues a cached prefix, dense on the fresh K/V otherwise)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from ..ops.attention import decode_append_paged, flash_attn_varlen_func, flash_attn_with_kvcache
from ..ops.kvcache import reshape_and_cache_flash
from .kv_quant import observer_of, quant_kwargs
from .rotary import RotaryEmbedding


@dataclass
class AttnMetadata:
    slot_mapping: torch.Tensor                       # [T] cache slot of every token row
    num_decode: int = 0                              # decode rows (first rows of the batch)
    decode_seqlens: Optional[torch.Tensor] = None    # int32 [num_decode] tokens in cache incl. new
    decode_block_table: Optional[torch.Tensor] = None  # int32 [num_decode, max_blocks]
    decode_positions: Optional[torch.Tensor] = None  # int32 [num_decode] tokens in cache before the new one
    num_prefill_tokens: int = 0
    prefill_cu_q: Optional[torch.Tensor] = None      # int32 [num_prefill + 1]
    prefill_cu_k: Optional[torch.Tensor] = None      # int32 [num_prefill + 1] (paged: context + new)
    prefill_max_q: int = 0
    prefill_max_k: int = 0
    prefill_block_table: Optional[torch.Tensor] = None  # None: all chunks start at 0 (dense path)


def _as_batch(x: torch.Tensor) -> torch.Tensor:
    """[n, H, D] rows -> [n, 1, H, D] whose length-1 dim carries the row stride (kernels may walk
    rows as b * s + i with the seq-dim stride, which plain unsqueeze(1) would set differently)."""
    n, h, d = x.shape
    s0, s1, s2 = x.stride()
    return x.as_strided((n, 1, h, d), (s0, s0, s1, s2))


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttnMetadata, scale: float,
                    window: Tuple[int, int], out: torch.Tensor,
                    rotary: Optional[RotaryEmbedding] = None,
                    positions: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D] (head_dim contiguous); writes and returns out [T, H, D].

    With `rotary` (and the rows' `positions`) q and k are rotated first. On CPU, when the metadata
    has decode_positions, the decode rows take one kernel call per layer that rotates, writes the
    cache and attends (decode_append_paged: at batch 1 the three separate calls cost more than
    the attention itself); their q rows are left unrotated in q.

    A quantised cache (layers/kv_quant.py: fp8 / int8 codes with scales) is written and read with
    its kv_cache_dtype and scales; the dense prefill path attends to the fresh k/v as they are."""
    nd = meta.num_decode
    kq = quant_kwargs(k_cache)
    fused = (nd > 0 and rotary is not None and meta.decode_positions is not None and not q.is_cuda
             and q.shape[-1] % 8 == 0)
    if fused:
        if meta.num_prefill_tokens:
            rotary(positions[nd:], q[nd:], k[nd:])
            reshape_and_cache_flash(k[nd:], v[nd:], k_cache, v_cache, meta.slot_mapping[nd:], **kq)
        rows = (q, k, v, out) if nd == q.shape[0] else (q[:nd], k[:nd], v[:nd], out[:nd])
        qd, kd, vd, od = (_as_batch(t) for t in rows)
        decode_append_paged(qd, k_cache, v_cache, kd, vd, rotary.cos, rotary.sin, meta.decode_positions,
                            meta.decode_block_table, scale, window, od, **kq)
    else:
        if rotary is not None:
            rotary(positions, q, k)
        observer = observer_of(k_cache)
        if observer is not None:
            observer(k, v)
        reshape_and_cache_flash(k, v, k_cache, v_cache, meta.slot_mapping, **kq)
    if nd and not fused:
        flash_attn_with_kvcache(
            _as_batch(q[:nd]), k_cache, v_cache, cache_seqlens=meta.decode_seqlens,
            block_table=meta.decode_block_table, softmax_scale=scale, causal=True,
            window_size=window, out=_as_batch(out[:nd]), **kq)
    if meta.num_prefill_tokens:
        if meta.prefill_block_table is None:
            flash_attn_varlen_func(
                q[nd:], k[nd:], v[nd:], meta.prefill_cu_q, meta.prefill_cu_q, meta.prefill_max_q,
                meta.prefill_max_q, softmax_scale=scale, causal=True, window_size=window, out=out[nd:])
        else:
            flash_attn_varlen_func(
                q[nd:], k_cache, v_cache, meta.prefill_cu_q, meta.prefill_cu_k, meta.prefill_max_q,
                meta.prefill_max_k, softmax_scale=scale, causal=True, window_size=window,
                block_table=meta.prefill_block_table, out=out[nd:], **kq)
    return out
