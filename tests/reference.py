"""Plain-torch references the kernel tests compare against (fp32 upcast, no llmkern code).

Sections: KV cache, attention, sampling. Each reference is written from the semantics in the
peer project's documentation, independently of the kernels.
"""
from __future__ import annotations

import torch

# ---------------------------------------------------------------------------------------------
# KV cache (vLLM semantics)
# ---------------------------------------------------------------------------------------------


def ref_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping):
    """Returns new caches: cache.view(-1, H, D)[slot] = key[token] for slots >= 0."""
    kc, vc = key_cache.clone(), value_cache.clone()
    nb, bs, h, d = kc.shape
    n = slot_mapping.shape[0]
    slots = slot_mapping.long()
    keep = slots >= 0
    idx = slots[keep]
    kc.view(nb * bs, h, d)[idx] = key[:n][keep]
    vc.view(nb * bs, h, d)[idx] = value[:n][keep]
    return kc, vc


def ref_copy_blocks(key_caches, value_caches, block_mapping):
    out_k = [c.clone() for c in key_caches]
    out_v = [c.clone() for c in value_caches]
    for src, dst in block_mapping.tolist():
        for ck, cv in zip(out_k, out_v):
            ck[dst] = ck[src].clone()
            cv[dst] = cv[src].clone()
    return out_k, out_v


# ---------------------------------------------------------------------------------------------
# Attention (flash-attn 2 semantics)
# ---------------------------------------------------------------------------------------------


def ref_attention(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
                  compute_dtype=torch.float32):
    """One sequence: q [sq, Hq, D], k/v [sk, Hkv, D] -> (out [sq, Hq, D], lse [Hq, sq]).

    Computed in compute_dtype (fp32 for the reference; the input dtype for the "same-dtype torch"
    error baseline of the tolerance rule). Query i sits at key position i + sk - sq."""
    sq, hq, _ = q.shape
    sk, hkv = k.shape[0], k.shape[1]
    qf, kf, vf = (t.to(compute_dtype) for t in (q, k, v))
    kf = kf.repeat_interleave(hq // hkv, dim=1)
    vf = vf.repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", qf, kf).float() * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    pos = torch.arange(sq, device=q.device)[:, None] + sk - sq  # [sq, 1]
    j = torch.arange(sk, device=q.device)[None, :]
    if alibi is not None:
        s = s - alibi.float()[:, None, None] * (pos - j).abs()[None].float()
    left, right = window
    if causal:
        right = 0
    allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        allowed &= j >= pos - left
    if right >= 0:
        allowed &= j <= pos + right
    s = s.masked_fill(~allowed[None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [Hq, sq]; -inf for rows that see nothing
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    p = p.to(compute_dtype)
    out = torch.einsum("hqk,khd->qhd", p, vf).float()
    lse = torch.where(torch.isinf(lse) & (lse < 0), torch.full_like(lse, float("inf")), lse)
    return out, lse


def gather_paged(cache, block_table_row, length):
    """Rows 0..length-1 of one sequence from a paged cache [num_blocks, block_size, H, D]."""
    bs = cache.shape[1]
    nblk = (length + bs - 1) // bs
    blocks = block_table_row[:nblk].long()
    return cache[blocks].reshape(-1, cache.shape[2], cache.shape[3])[:length]


def ref_varlen(q, k, v, cu_q, cu_k, scale, block_table=None, compute_dtype=torch.float32, **kw):
    """flash_attn_varlen_func reference: (out [total_q, Hq, D] fp32, lse [Hq, total_q])."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("inf"), device=q.device)
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cu_q) - 1):
        q0, q1 = cu_q[b], cu_q[b + 1]
        if q1 == q0:
            continue
        if block_table is None:
            kb, vb = k[cu_k[b]:cu_k[b + 1]], v[cu_k[b]:cu_k[b + 1]]
        else:
            n = cu_k[b + 1] - cu_k[b]
            kb, vb = gather_paged(k, block_table[b], n), gather_paged(v, block_table[b], n)
        alibi = kw.get("alibi")
        kw_b = dict(kw, alibi=(alibi[b] if alibi is not None and alibi.dim() == 2 else alibi))
        o, l = ref_attention(q[q0:q1], kb, vb, scale, compute_dtype=compute_dtype, **kw_b)
        out[q0:q1], lse[:, q0:q1] = o, l
    return out, lse


def ref_kvcache(q, k_cache, v_cache, cache_seqlens, scale, k=None, v=None, block_table=None,
                compute_dtype=torch.float32, **kw):
    """flash_attn_with_kvcache reference. Returns (out [b, s, Hq, D] fp32, lse [b, Hq, s], new
    k_cache, new v_cache) where the caches hold k/v appended at cache_seqlens (copies)."""
    kc, vc = k_cache.clone(), v_cache.clone()
    b_, s_, hq, d = q.shape
    lens = cache_seqlens.tolist()
    s_new = 0 if k is None else k.shape[1]
    for b in range(b_):
        for i in range(s_new):
            pos = lens[b] + i
            if block_table is None:
                kc[b, pos], vc[b, pos] = k[b, i], v[b, i]
            else:
                bs = kc.shape[1]
                blk = int(block_table[b, pos // bs])
                kc[blk, pos % bs], vc[blk, pos % bs] = k[b, i], v[b, i]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full((b_, hq, s_), float("inf"), device=q.device)
    alibi = kw.get("alibi")
    for b in range(b_):
        n = lens[b] + s_new
        if block_table is None:
            kb, vb = kc[b, :n], vc[b, :n]
        else:
            kb, vb = gather_paged(kc, block_table[b], n), gather_paged(vc, block_table[b], n)
        kw_b = dict(kw, alibi=(alibi[b] if alibi is not None and alibi.dim() == 2 else alibi))
        o, l = ref_attention(q[b], kb, vb, scale, compute_dtype=compute_dtype, **kw_b)
        out[b], lse[b] = o, l
    return out, lse, kc, vc


# ---------------------------------------------------------------------------------------------
# Sampling (FlashInfer semantics)
# ---------------------------------------------------------------------------------------------
