"""The kernel calls behind FlashInfer's entry points: a batch of sequences, ragged or paged, on
llmkern's flash_attn_varlen_func (prefill) and flash_attn_with_kvcache (decode, split-KV on CUDA).

Masks map one to one: FlashInfer's causal mask is bottom-right aligned like flash-attn's, and
``window_left`` is flash-attn's left window (the right one open, or 0 when causal). Positional
encodings FlashInfer applies inside its kernels are applied around llmkern's: ROPE_LLAMA rotates
q and a gathered copy of the keys, ALIBI passes FlashInfer's slopes to the kernels' ALiBi."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...ops.attention import flash_attn_varlen_func, flash_attn_with_kvcache
from . import _torch_path
from ._common import alibi_slopes, lse_out, rope_llama


@dataclass
class Options:
    causal: bool
    sm_scale: float
    window_left: int
    soft_cap: float
    pos_encoding: str
    rope_scale: Optional[float] = None
    rope_theta: Optional[float] = None

    def window(self):
        return (self.window_left, 0 if self.causal else -1)

    def alibi(self, num_heads: int, device, multi_query: bool) -> Optional[torch.Tensor]:
        if self.pos_encoding != "ALIBI":
            return None
        return alibi_slopes(num_heads, device)

    def signed_alibi(self, multi_query: bool) -> bool:
        # FlashInfer's bias is slope * (key - query position): signed, so it equals flash-attn's
        # -slope * |distance| only where no key lies after the query (causal, or one last query).
        return self.pos_encoding == "ALIBI" and multi_query and not self.causal


def ragged(q, k, v, cu_q, cu_kv, max_q: int, max_kv: int, opt: Options, out, lse, return_lse: bool,
           q_pos: Optional[torch.Tensor] = None, k_pos: Optional[torch.Tensor] = None, block_table=None,
           custom_mask: Optional[torch.Tensor] = None):
    """``q [total_q, Hq, D]`` against dense ragged ``k``/``v [total_kv, Hkv, D]`` (or paged caches
    with ``block_table``). ``q_pos``/``k_pos``: token positions for ROPE_LLAMA (dense k only).
    ``custom_mask``: FlashInfer's flat boolean mask (runs on the torch path)."""
    if opt.pos_encoding == "ROPE_LLAMA":
        q = rope_llama(q, q_pos, opt.rope_scale, opt.rope_theta)
        k = rope_llama(k, k_pos, opt.rope_scale, opt.rope_theta)
    if custom_mask is not None or opt.signed_alibi(max_q > 1):
        res = _torch_path.attention(q, k, v, cu_q, cu_kv, opt, out, return_lse, block_table, custom_mask)
        return res if not return_lse else (res[0], lse_out(res[1], lse))
    res = flash_attn_varlen_func(
        q, k, v, cu_q, cu_kv, max_q, max_kv, softmax_scale=opt.sm_scale, causal=opt.causal,
        window_size=opt.window(), softcap=opt.soft_cap,
        alibi_slopes=opt.alibi(q.shape[1], q.device, max_q > 1), block_table=block_table,
        return_softmax_lse=return_lse, out=out)
    if not return_lse:
        return res
    o, lse_nat = res
    return o, lse_out(lse_nat, lse)


def decode(q, k_cache, v_cache, kv_lens, opt: Options, out, lse, return_lse: bool, block_table=None):
    """One query per sequence, ``q [b, Hq, D]``, against dense ``[b, kv_len, Hkv, D]`` or paged
    caches; ``kv_lens`` int32 ``[b]`` (or an int)."""
    o_view = None if out is None else out.unsqueeze(1)
    res = flash_attn_with_kvcache(
        q.unsqueeze(1), k_cache, v_cache, cache_seqlens=kv_lens, block_table=block_table,
        softmax_scale=opt.sm_scale, causal=False, window_size=(opt.window_left, -1),
        softcap=opt.soft_cap, alibi_slopes=opt.alibi(q.shape[1], q.device, False),
        return_softmax_lse=return_lse, out=o_view)
    o = res[0] if return_lse else res
    o = out if out is not None else o.squeeze(1)
    if not return_lse:
        return o
    lse_b = lse_out(res[1], None if lse is None else lse.unsqueeze(1)).reshape(q.shape[0], q.shape[1])
    return o, (lse if lse is not None else lse_b)


def positions(lens_q: torch.Tensor, lens_kv: torch.Tensor, device):
    """(query positions, key positions) of a ragged batch from host lengths: query i of a
    sequence sits at ``kv_len - qo_len + i``."""
    nq, nk = int(lens_q.sum()), int(lens_kv.sum())
    sq = torch.repeat_interleave(torch.arange(lens_q.numel()), lens_q)
    sk = torch.repeat_interleave(torch.arange(lens_kv.numel()), lens_kv)
    starts_q = torch.cumsum(lens_q, 0) - lens_q
    starts_k = torch.cumsum(lens_kv, 0) - lens_kv
    qp = torch.arange(nq) - starts_q[sq] + (lens_kv - lens_q)[sq]
    kp = torch.arange(nk) - starts_k[sk]
    return qp.to(device), kp.to(device)
