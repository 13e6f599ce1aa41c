"""Interim plain-torch bodies of the MoE ops with the kernels' entry-point signatures, used until
csrc/moe/ is built into the extension (so the Python API can be built on meanwhile)."""
from __future__ import annotations

import torch
from torch.utils.dlpack import from_dlpack


def _t(c):
    return None if c is None else from_dlpack(c)


def topk_softmax(weights, ids, gating_output, renormalize, stream):
    weights, ids, g = _t(weights), _t(ids), _t(gating_output)
    p = torch.softmax(g.float(), dim=-1)
    w, i = torch.topk(p, weights.shape[1], dim=-1)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    weights.copy_(w)
    ids.copy_(i)


def moe_align_block_size(topk_ids, E, B, sorted_ids, expert_ids, post_pad, stream):
    ids, s, e, p = _t(topk_ids), _t(sorted_ids), _t(expert_ids), _t(post_pad)
    flat = ids.reshape(-1).long()
    if ((flat < -1) | (flat >= E)).any():
        raise ValueError(f"topk_ids: entries must be in [0, num_experts={E}) or -1")
    s.fill_(flat.numel())
    e.fill_(-1)
    pos = 0
    for x in range(E):
        idx = (flat == x).nonzero().flatten()
        n = idx.numel()
        if n == 0:
            continue
        s[pos:pos + n] = idx.int()
        nb = -(-n // B)
        e[pos // B:pos // B + nb] = x
        pos += nb * B
    p.fill_(pos)


def _moe(out, x, gate_up, down, I, tw, tid, emap):
    T, k = tid.shape
    acc = torch.zeros(T, out.shape[1], dtype=torch.float32)
    ids = tid.long()
    if emap is not None:
        valid = ids >= 0
        ids = torch.where(valid, emap.long()[ids.clamp(min=0)], ids)
    for t in range(T):
        for j in range(k):
            e = int(ids[t, j])
            if e < 0:
                continue
            h = gate_up(e, x[t:t + 1].float())
            h = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
            acc[t] += float(tw[t, j]) * down(e, h)[0]
    out.copy_(acc)


def fused_moe(out, x, w13, w2, tw, tid, emap, stream):
    out, x, w13, w2, tw, tid, emap = map(_t, (out, x, w13, w2, tw, tid, emap))
    _moe(out, x, lambda e, h: h @ w13[e].float().t(), lambda e, h: h @ w2[e].float().t(), w2.shape[2],
         tw, tid, emap)


def fused_moe_packed(out, x, w13p, w2p, I, tw, tid, emap, stream):
    out, x, w13p, w2p, tw, tid, emap = map(_t, (out, x, w13p, w2p, tw, tid, emap))
    H = out.shape[1]

    def unpack(p, n):
        E, P, K, W = p.shape
        return p.transpose(2, 3).reshape(E, P * W, K)[:, :n]
    w13, w2 = unpack(w13p, 2 * I), unpack(w2p, H)
    _moe(out, x, lambda e, h: h @ w13[e].t(), lambda e, h: h @ w2[e].t(), I, tw, tid, emap)
