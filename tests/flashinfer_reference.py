"""fp64 plain-torch references for FlashInfer's attention semantics (written from its documented
behaviour, no llmkern code): RoPE-LLaMA, signed ALiBi, soft cap, left window, bottom-right causal
mask, base-2 lse; and a paged cache builder for the tests."""
from __future__ import annotations

import math

import torch


def rope(x, pos, scale=1.0, theta=1e4):
    """x [n, H, D] at positions [n]: halves (i, i + D/2) rotated by pos / scale * theta^(-2i/D)."""
    d = x.shape[-1]
    half = d // 2
    inv = theta ** (-torch.arange(half, dtype=torch.float64) * 2.0 / d) / scale
    ang = pos.double()[:, None] * inv[None]
    c, s = ang.cos()[:, None], ang.sin()[:, None]
    a, b = x[..., :half].double(), x[..., half:].double()
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def slopes(n):
    p = 2 ** math.floor(math.log2(n))
    out = [2.0 ** (-8.0 * (i + 1) / p) for i in range(p)]
    return torch.tensor(out + [2.0 ** (-4.0 * (2 * i + 1) / p) for i in range(n - p)], dtype=torch.float64)


def attend(q, k, v, causal=False, sm_scale=None, window_left=-1, soft_cap=0.0, mode="NONE", mask=None):
    """One sequence: q [sq, Hq, D], k/v [sk, Hkv, D] -> (out [sq, Hq, D] fp64, lse2 [sq, Hq]).
    ``mask`` [sq, sk] bool (True = attend) replaces the causal mask, as FlashInfer's custom_mask."""
    sq, hq, d = q.shape
    sk, hkv = k.shape[0], k.shape[1]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    qpos = torch.arange(sq) + sk - sq
    kpos = torch.arange(sk)
    qf, kf, vf = q.double(), k.double(), v.double()
    if mode == "ROPE_LLAMA":
        qf, kf = rope(qf, qpos), rope(kf, kpos)
    kf = kf.repeat_interleave(hq // hkv, dim=1)
    vf = vf.repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", qf, kf) * scale
    if soft_cap > 0:
        s = soft_cap * torch.tanh(s / soft_cap)
    dist = (kpos[None, :] - qpos[:, None]).double()  # key minus query position
    if mode == "ALIBI":
        s = s + slopes(hq)[:, None, None] * dist[None]
    allowed = torch.ones(sq, sk, dtype=torch.bool) if mask is None else mask.clone()
    if causal and mask is None:
        allowed &= dist <= 0
    if window_left >= 0:
        allowed &= dist >= -window_left
    s = s.masked_fill(~allowed[None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("hqk,khd->qhd", p, vf)
    return out, (lse / math.log(2.0)).transpose(0, 1)


def paged(ks, vs, page_size, layout="NHD", shuffle=True, gen=None):
    """Per-sequence keys/values [len, H, D] -> (cache [pages, 2, ...], kv_indptr, kv_indices,
    kv_last_page_len), pages in a shuffled order with one spare page."""
    h, d = ks[0].shape[1], ks[0].shape[2]
    counts = [max(1, -(-k.shape[0] // page_size)) if k.shape[0] else 0 for k in ks]
    total = sum(counts) + 1
    order = torch.randperm(total, generator=gen) if shuffle else torch.arange(total)
    cache = torch.randn(total, 2, page_size, h, d, dtype=ks[0].dtype, generator=gen)
    indptr, indices, last = [0], [], []
    nxt = 0
    for k, v, c in zip(ks, vs, counts):
        pages = order[nxt:nxt + c].tolist()
        nxt += c
        for j, pg in enumerate(pages):
            rows = slice(j * page_size, min((j + 1) * page_size, k.shape[0]))
            n = rows.stop - rows.start
            cache[pg, 0, :n], cache[pg, 1, :n] = k[rows], v[rows]
        indices += pages
        indptr.append(len(indices))
        last.append(k.shape[0] - (c - 1) * page_size if c else 0)
    if layout == "HND":
        cache = cache.transpose(2, 3).contiguous()
    i32 = dict(dtype=torch.int32)
    return cache, torch.tensor(indptr, **i32), torch.tensor(indices, **i32), torch.tensor(last, **i32)
