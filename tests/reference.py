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
