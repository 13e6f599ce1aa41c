"""TEMPORARY pure-torch stand-ins for the llmkern attention and sampling ops (same signatures:
flash-attn 2 and FlashInfer), used only until those kernels are available. Slow reference code;
delete this module once kernels.py imports the real ops."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F


def _attend(q, k, v, scale, causal, window):
    """q [sq, H, D], k/v [sk, Hkv, D] -> [sq, H, D] (bottom-right aligned causal / window mask)."""
    sq, sk = q.shape[0], k.shape[0]
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    i = torch.arange(sq).unsqueeze(1) + (sk - sq)
    j = torch.arange(sk).unsqueeze(0)
    left, right = window
    if causal:
        right = 0
    mask = torch.zeros(sq, sk, dtype=torch.bool)
    if right >= 0:
        mask |= j > i + right
    if left >= 0:
        mask |= j < i - left
    s.masked_fill_(mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v.float()).to(q.dtype)


def _paged_rows(cache, block_table_row, n):
    bs = cache.shape[1]
    nblk = (n + bs - 1) // bs
    return cache[block_table_row[:nblk].long()].reshape(-1, *cache.shape[2:])[:n]


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None, return_softmax_lse=False, block_table=None, out=None):
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    if out is None:
        out = torch.empty_like(q)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        qs = q[cq[b]:cq[b + 1]]
        if block_table is None:
            ks, vs = k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]
        else:
            n = ck[b + 1] - ck[b]
            ks, vs = _paged_rows(k, block_table[b], n), _paged_rows(v, block_table[b], n)
        out[cq[b]:cq[b + 1]] = _attend(qs, ks, vs, scale, causal, window_size)
    return out


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            alibi_slopes=None, num_splits=0, return_softmax_lse=False, out=None):
    assert k is None and v is None, "stand-in: append through reshape_and_cache_flash"
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    if out is None:
        out = torch.empty_like(q)
    lens = cache_seqlens.tolist()
    for b in range(q.shape[0]):
        ks = _paged_rows(k_cache, block_table[b], lens[b])
        vs = _paged_rows(v_cache, block_table[b], lens[b])
        out[b] = _attend(q[b], ks, vs, scale, causal, window_size)
    return out


def _as_row_param(x, n, dtype):
    if isinstance(x, torch.Tensor):
        return x.to(dtype).reshape(-1).expand(n) if x.numel() == 1 else x.to(dtype)
    return torch.full((n,), x, dtype=dtype)


def top_k_mask_logits(logits, top_k):
    k = _as_row_param(top_k, logits.shape[0], torch.int64).clamp(1, logits.shape[1])
    kth = torch.sort(logits, dim=-1, descending=True).values.gather(1, (k - 1).unsqueeze(1))
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_renorm_probs(probs, top_p):
    p = _as_row_param(top_p, probs.shape[0], torch.float32).unsqueeze(1)
    sp, idx = torch.sort(probs, dim=-1, descending=True)
    excl = torch.cumsum(sp, dim=-1) - sp
    sp = sp.masked_fill(excl >= p, 0.0)
    out = torch.zeros_like(probs).scatter_(1, idx, sp)
    return out / out.sum(-1, keepdim=True)


def _sample(probs, generator):
    return torch.multinomial(probs, 1, generator=generator).squeeze(1).to(torch.int32)


def sampling_from_logits(logits, indices=None, deterministic=True, generator=None, check_nan=False):
    return _sample(torch.softmax(logits.float(), -1), generator)


def top_k_top_p_sampling_from_logits(logits, top_k, top_p, indices=None, filter_apply_order="top_k_first",
                                     deterministic=True, generator=None, check_nan=False):
    probs = torch.softmax(top_k_mask_logits(logits.float(), top_k), -1)
    return _sample(top_p_renorm_probs(probs, top_p), generator)


def min_p_sampling_from_probs(probs, min_p, indices=None, deterministic=True, generator=None, check_nan=False):
    m = _as_row_param(min_p, probs.shape[0], torch.float32).unsqueeze(1)
    keep = probs >= m * probs.max(-1, keepdim=True).values
    return _sample(probs * keep, generator)


def apply_penalties(logits, output_token_counts=None, repetition_penalties=1.0, frequency_penalties=0.0,
                    presence_penalties=0.0, prompt_mask=None, output_token_ids=None, prompt_token_ids=None):
    b, V = logits.shape

    def row_param(x):
        return _as_row_param(x, b, logits.dtype).unsqueeze(1)

    def to_mask(ids):
        m = torch.zeros(b, V + 1, dtype=torch.bool)
        ids = ids.long().clone()
        ids[(ids < 0) | (ids >= V)] = V
        return m.scatter_(1, ids, True)[:, :V]

    if output_token_counts is None:
        ids = output_token_ids.long().clone()
        ids[(ids < 0) | (ids >= V)] = V
        output_token_counts = torch.zeros(b, V + 1, dtype=logits.dtype).scatter_add_(
            1, ids, torch.ones_like(ids, dtype=logits.dtype))[:, :V]
    counts = output_token_counts.to(logits.dtype)
    seen = counts > 0
    if prompt_mask is not None:
        seen = seen | prompt_mask
    elif prompt_token_ids is not None:
        seen = seen | to_mask(prompt_token_ids)
    rp = row_param(repetition_penalties)
    pen = torch.where(logits > 0, logits / rp, logits * rp)
    logits.copy_(torch.where(seen, pen, logits))
    logits -= row_param(frequency_penalties) * counts + row_param(presence_penalties) * (counts > 0).to(logits.dtype)
    return logits
