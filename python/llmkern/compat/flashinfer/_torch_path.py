"""FlashInfer attention that llmkern's kernels cannot express, computed in fp32 torch per
sequence (memory ``heads * qo_len * kv_len`` per sequence), so such calls give FlashInfer's
results, more slowly, instead of being refused:

- ALiBi on a non-causal prefill: FlashInfer adds ``slope * (key - query position)``, a signed
  bias that rewards keys after the query; the kernels' ALiBi is flash-attn's ``-slope * |distance|``.
- ``custom_mask``: FlashInfer's boolean mask (True = attend), per request ``[qo_len, kv_len]``
  row-major, the requests' masks concatenated; it replaces the causal mask, as in FlashInfer
  (the window still applies)."""
from __future__ import annotations

from typing import Optional

import torch

from ._common import alibi_slopes


def _keys(k_cache, cu_kv, block_table, b: int):
    lo, hi = int(cu_kv[b]), int(cu_kv[b + 1])
    if block_table is None:
        return k_cache[lo:hi]
    n = hi - lo
    pages = -(-n // k_cache.shape[1])
    return k_cache[block_table[b, :pages].long()].flatten(0, 1)[:n]


def attention(q, k, v, cu_q, cu_kv, opt, out: Optional[torch.Tensor], return_lse: bool, block_table=None,
              custom_mask: Optional[torch.Tensor] = None):
    """``q [total_q, Hq, D]`` against ragged (or paged, with ``block_table``) ``k``/``v``; returns
    what flash_attn_varlen_func does: ``out`` and, with ``return_lse``, the natural-log lse
    ``[Hq, total_q]`` (+inf where a query sees no key)."""
    total, hq, d = q.shape
    o = torch.zeros(total, hq, v.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.full((hq, total), float("inf"), dtype=torch.float32, device=q.device)
    slopes = alibi_slopes(hq, q.device)
    cu_q_h, cu_kv_h = cu_q.cpu(), cu_kv.cpu()
    table = None if block_table is None else block_table.cpu()
    mask_at = 0
    for b in range(cu_q_h.numel() - 1):
        q0, q1 = int(cu_q_h[b]), int(cu_q_h[b + 1])
        kb, vb = _keys(k, cu_kv_h, table, b), _keys(v, cu_kv_h, table, b)
        sq, sk = q1 - q0, kb.shape[0]
        allowed = None
        if custom_mask is not None:
            allowed = custom_mask[mask_at:mask_at + sq * sk].reshape(sq, sk).to(q.device, torch.bool)
            mask_at += sq * sk
        if sq == 0 or sk == 0:
            continue
        rep = hq // kb.shape[1]
        kb, vb = kb.float().repeat_interleave(rep, 1), vb.float().repeat_interleave(rep, 1)
        s = torch.einsum("qhd,khd->hqk", q[q0:q1].float(), kb) * opt.sm_scale
        if opt.soft_cap > 0:
            s = opt.soft_cap * torch.tanh(s / opt.soft_cap)
        dist = (torch.arange(sk, device=q.device)[None, :] - torch.arange(sq, device=q.device)[:, None]
                - (sk - sq)).float()  # key minus query position (queries are the last sq positions)
        if opt.pos_encoding == "ALIBI":
            s = s + slopes[:, None, None] * dist
        if allowed is None:
            allowed = dist <= 0 if opt.causal else torch.ones_like(dist, dtype=torch.bool)
        if opt.window_left >= 0:
            allowed = allowed & (dist >= -opt.window_left)
        s = s.masked_fill(~allowed, float("-inf"))
        lse_b = torch.logsumexp(s, -1)
        seen = torch.isfinite(lse_b)
        p = torch.where(seen[..., None], torch.exp(s - lse_b[..., None]), torch.zeros_like(s))
        o[q0:q1] = torch.einsum("hqk,khd->qhd", p, vb)
        lse[:, q0:q1] = torch.where(seen, lse_b, torch.full_like(lse_b, float("inf")))
    if out is not None:
        out.copy_(o)
        o = out
    else:
        o = o.to(q.dtype)
    return (o, lse) if return_lse else o
