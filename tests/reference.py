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


def ref_rotary_rows(x, cos, sin, positions, interleaved):
    """flash-attn's rotary: x [n, H, D] rows at positions [n]; cos/sin [seqlen_ro, rd/2]. The
    first rd features rotate in pairs (2i, 2i+1) if interleaved else (i, i + rd/2). fp32."""
    rd = cos.shape[1] * 2
    xf = x.float().clone()
    c = cos.float()[positions.long()][:, None, :]
    s = sin.float()[positions.long()][:, None, :]
    if interleaved:
        a, b = xf[..., 0:rd:2].clone(), xf[..., 1:rd:2].clone()
        xf[..., 0:rd:2], xf[..., 1:rd:2] = a * c - b * s, a * s + b * c
    else:
        a, b = xf[..., : rd // 2].clone(), xf[..., rd // 2: rd].clone()
        xf[..., : rd // 2], xf[..., rd // 2: rd] = a * c - b * s, a * s + b * c
    return xf


# ---------------------------------------------------------------------------------------------
# Sampling (FlashInfer semantics)
# ---------------------------------------------------------------------------------------------

M32 = 0xFFFFFFFF


def ref_philox4x32_10(ctr, key):
    """Philox 4x32-10 written from the published algorithm (Salmon et al., SC'11)."""
    c = [int(v) & M32 for v in ctr]
    k0, k1 = int(key[0]) & M32, int(key[1]) & M32
    for r in range(10):
        if r:
            k0 = (k0 + 0x9E3779B9) & M32
            k1 = (k1 + 0xBB67AE85) & M32
        p0 = 0xD2511F53 * c[0]
        p1 = 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c[3] ^ k1) & M32, p0 & M32]
    return c


def ref_uniform(seed: int, offset: int, row: int, draw: int) -> float:
    """The uniform of draw `draw` of output row `row` (llmkern's counter layout)."""
    seed &= 2**64 - 1
    offset &= 2**64 - 1
    x = ref_philox4x32_10([offset & M32, offset >> 32, row, draw], [seed & M32, seed >> 32])[0]
    return (x >> 8) / 16777216.0


def _mass_strictly_greater(w):
    """For each entry, the sum of the entries strictly greater (fp64, via sorting)."""
    w = w.double()
    s, order = torch.sort(w, descending=True)
    excl = torch.cumsum(s, 0) - s
    # ties: every member of a tied group gets the exclusive sum at the group's first position
    _, counts = torch.unique_consecutive(s, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    excl = torch.repeat_interleave(excl[starts], counts)
    out = torch.empty_like(w)
    out[order] = excl
    return out


def ref_top_k_keep(w, k: int):
    """Top-k kept set of one row of weights: fewer than k entries strictly greater (ties kept)."""
    w = w.double()
    pos = w > 0
    if k <= 0 or k >= int(pos.sum()):
        return pos
    kth = torch.sort(w, descending=True).values[k - 1]
    return (w >= kth) & pos


def ref_top_p_keep(w, p: float, ref_mass=None):
    w = w.double()
    pos = w > 0
    if p >= 1.0:
        return pos
    total = w[pos].sum() if ref_mass is None else ref_mass
    return (_mass_strictly_greater(torch.where(pos, w, torch.zeros_like(w))) < p * total) & pos


def ref_min_p_keep(w, min_p: float):
    w = w.double()
    return (w >= min_p * w.max()) & (w > 0)


def ref_keep(w, top_k=0, top_p=1.0, min_p=0.0, order="joint"):
    """Kept set of a row under llmkern's filter rules (see ops/sampling.py)."""
    keep = w.double() > 0
    if min_p > 0:
        keep &= ref_min_p_keep(w, min_p)
    if order == "top_k_first" and top_k > 0 and top_p < 1.0:
        kk = ref_top_k_keep(w, top_k)
        return kk & ref_top_p_keep(torch.where(kk, w.double(), torch.zeros_like(w.double())), top_p)
    if top_k > 0:
        keep &= ref_top_k_keep(w, top_k)
    if top_p < 1.0:
        keep &= ref_top_p_keep(w, top_p)
    return keep


def ref_filtered_probs(w, **filters):
    """The distribution sampling draws from: weights on the kept set, renormalised (fp64)."""
    keep = ref_keep(w, **filters)
    d = torch.where(keep, w.double(), torch.zeros_like(w.double()))
    return d / d.sum()


def ref_apply_penalties(logits, output_counts, prompt_mask, rep, freq, pres):
    """vLLM's apply_penalties on fp32 logits; rep/freq/pres are (b,) tensors."""
    x = logits.float().clone()
    counts = output_counts.float()
    seen = prompt_mask | (output_counts > 0)
    r = torch.where(seen, rep[:, None].float(), torch.ones_like(x))
    x = torch.where(x > 0, x / r, x * r)
    x = x - freq[:, None].float() * counts
    x = x - pres[:, None].float() * (output_counts > 0).float()
    return x
