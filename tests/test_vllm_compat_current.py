"""llmkern.compat.vllm_ops: the signatures vLLM's current ``_custom_ops`` uses (swap_blocks with a
byte size, the 5-D reshape_and_cache, rms_norm without weight, topk_softmax / topk_sigmoid with
bias, scaling and padding rows, moe_align_block_size with expert_map and vLLM's fill values,
batched_moe_align_block_size), against plain-torch references of vLLM's documented behaviour."""
from __future__ import annotations

import pytest
import torch

from llmkern.compat import vllm_ops as ops


def test_swap_blocks_new_and_old_signatures():
    src = torch.randn(6, 4, 2, 8)
    dst = torch.zeros(6, 4, 2, 8)
    mapping = torch.tensor([[0, 3], [5, 1]])
    ops.swap_blocks(src, dst, src.element_size() * src[0].numel(), mapping)
    assert torch.equal(dst[3], src[0]) and torch.equal(dst[1], src[5]) and dst[0].abs().sum() == 0
    dst2 = torch.zeros_like(dst)
    ops.swap_blocks(src, dst2, mapping)  # the pre-0.11 form
    assert torch.equal(dst, dst2)
    half = torch.zeros_like(dst)
    ops.swap_blocks(src, half, src.element_size() * src[0].numel() // 2, mapping)
    assert torch.equal(half[3].flatten()[:32], src[0].flatten()[:32]) and half[3].flatten()[32:].abs().sum() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_embedding_is_a_custom_op(dtype):
    # vLLM's test_rotary_embedding.py opchecks torch.ops._C.rotary_embedding on strided views.
    pos = torch.randint(0, 64, (1, 9))
    q = torch.randn(1, 9, 3, 40 + 64, dtype=dtype)[..., :40]
    k = torch.randn(1, 9, 3, 40 + 64, dtype=dtype)[..., :40]
    cache = torch.randn(64, 32, dtype=dtype)
    torch.library.opcheck(ops.rotary_embedding.op, (pos, q, k, 40, cache, False))
    torch.library.opcheck(ops.rotary_embedding.op, (pos, q, None, 40, cache, True))


def test_swap_blocks_is_a_custom_op():
    # vLLM's tests opcheck torch.ops._C_cache_ops.swap_blocks: schema, fake tensor, in-place dst.
    src, dst = torch.randn(5, 3, 16, dtype=torch.bfloat16), torch.zeros(5, 3, 16, dtype=torch.bfloat16)
    mapping = torch.tensor([[4, 0], [1, 2]])
    torch.library.opcheck(ops.swap_blocks.op, (src, dst, src.element_size() * src.stride(0), mapping))
    ops.swap_blocks.op(src, dst, src.element_size() * src.stride(0), mapping)
    assert torch.equal(dst[0], src[4]) and torch.equal(dst[2], src[1]) and not dst[[1, 3, 4]].any()


def test_reshape_and_cache_5d(backend):
    nb, h, d, bs, x = 5, 2, 16, 4, 8
    key, value = torch.randn(7, h, d), torch.randn(7, h, d)
    kc, vc = torch.zeros(nb, h, d // x, bs, x), torch.zeros(nb, h, d, bs)
    slots = torch.tensor([0, 5, -1, 19, 8, 3, 10])
    ops.reshape_and_cache(key, value, kc, vc, slots, "auto", None, None)
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        b, o = divmod(s, bs)
        assert torch.equal(kc[b, :, :, o, :].reshape(h, d), key[t])
        assert torch.equal(vc[b, :, :, o], value[t])
    assert kc.count_nonzero() == 6 * h * d


@pytest.mark.parametrize("kind", ["fp8", "fp8_e5m2", "int8"])
def test_reshape_and_cache_5d_quantised_matches_the_flash_layout(backend, kind):
    nb, h, d, bs, x = 3, 2, 16, 4, 8
    key, value = torch.randn(7, h, d) * 20, torch.randn(7, h, d)
    code = torch.int8 if kind == "int8" else torch.uint8
    kc, vc = torch.zeros(nb, h, d // x, bs, x, dtype=code), torch.zeros(nb, h, d, bs, dtype=code)
    slots = torch.tensor([0, 5, -1, 11, 8, 3, 10])
    ks, vs = torch.tensor([0.05, 0.2]), torch.tensor([0.01])
    ops.reshape_and_cache(key, value, kc, vc, slots, kind, ks, vs)
    fk, fv = torch.zeros(nb, bs, h, d, dtype=code), torch.zeros(nb, bs, h, d, dtype=code)
    ops.reshape_and_cache_flash(key, value, fk, fv, slots, kind, ks, vs)
    assert torch.equal(kc.permute(0, 3, 1, 2, 4).reshape(nb, bs, h, d), fk)
    assert torch.equal(vc.permute(0, 3, 1, 2), fv)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        ops.reshape_and_cache(key, value, kc, vc, slots, "fp4", ks, vs)


def test_rms_norm_without_weight(backend):
    x = torch.randn(3, 64)
    out = torch.empty_like(x)
    ops.rms_norm(out, x, None, 1e-6)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def _ref_route(g, k, renorm, bias=None, scoring="softmax", scale=1.0):
    s = torch.softmax(g.float(), -1) if scoring == "softmax" else torch.sigmoid(g.float())
    choice = s if bias is None else s + bias[None]
    i = torch.sort(choice, dim=-1, descending=True, stable=True)[1][:, :k]  # ties: lower id first
    w = s.gather(1, i)
    if renorm:
        w = w / w.sum(-1, keepdim=True)
    return w * scale, i.to(torch.int32)


def _buffers(T, k):
    return (torch.empty(T, k), torch.empty(T, k, dtype=torch.int32), torch.empty(T, k, dtype=torch.int32))


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("renorm", [False, True])
def test_topk_routing(backend, scoring, with_bias, renorm):
    g = torch.randn(9, 16).to(torch.bfloat16)
    bias = torch.randn(16) if with_bias else None
    w, i, tei = _buffers(9, 4)
    if scoring == "softmax":
        ops.topk_softmax(w, i, tei, g, renorm, bias)
    else:
        ops.topk_sigmoid(w, i, tei, g, renorm, bias, 2.5)
    rw, ri = _ref_route(g, 4, renorm, bias, scoring, 1.0 if scoring == "softmax" else 2.5)
    assert torch.equal(i, ri)
    torch.testing.assert_close(w, rw, atol=1e-6, rtol=1e-6)
    assert torch.equal(tei, torch.arange(4)[None] * 9 + torch.arange(9)[:, None])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_topk_poisoned_and_padding_rows(bad):
    g = torch.randn(4, 8)
    g[1:] = bad
    w, i, tei = _buffers(4, 3)
    ops.topk_softmax(w, i, tei, g, False)
    assert all(i[r].unique().numel() == 3 for r in range(4)) and torch.isfinite(w).all()
    pad = torch.tensor([False, True, False, True])
    ops.topk_sigmoid(w, i, tei, torch.randn(4, 8), True, None, 1.0, pad)
    assert (i[pad] == 8).all() and (w[pad] == 0).all() and (i[~pad] < 8).all()


def _ref_align(topk_ids, E, bs):
    flat = topk_ids.flatten()
    sorted_ids, experts, pos = [], [], 0
    for e in range(E):
        toks = (flat == e).nonzero().flatten().tolist()
        if not toks:
            continue
        n = -(-len(toks) // bs) * bs
        sorted_ids += toks + [flat.numel()] * (n - len(toks))
        experts += [e] * (n // bs)
        pos += n
    return sorted_ids, experts, pos


def test_moe_align_block_size_vllm_fill_values(backend):
    E, bs = 8, 4
    topk_ids = torch.stack([torch.randperm(E)[:2] for _ in range(6)]).to(torch.int32)
    cap = topk_ids.numel() + E * (bs - 1)
    s, e, n = torch.empty(cap, dtype=torch.int32), torch.empty(-(-cap // bs), dtype=torch.int32), \
        torch.empty(1, dtype=torch.int32)
    ops.moe_align_block_size(topk_ids, E, bs, s, e, n)
    rs, re_, rn = _ref_align(topk_ids, E, bs)
    assert n.item() == rn
    assert e[:len(re_)].tolist() == re_ and (e[len(re_):] == 0).all()
    assert (s[rn:] == topk_ids.numel()).all()
    for blk in range(rn // bs):  # same tokens per block, any order
        got = sorted(s[blk * bs:(blk + 1) * bs].tolist())
        assert got == sorted(rs[blk * bs:(blk + 1) * bs])


def test_moe_align_block_size_expert_map_drops_other_ranks(backend):
    E, bs = 8, 4
    topk_ids = torch.stack([torch.randperm(E)[:2] for _ in range(5)]).to(torch.int32)
    expert_map = torch.full((E,), -1, dtype=torch.int32)
    expert_map[0::2] = torch.arange(4, dtype=torch.int32)
    cap = topk_ids.numel() + E * (bs - 1)
    s, e, n = torch.empty(cap, dtype=torch.int32), torch.empty(-(-cap // bs), dtype=torch.int32), \
        torch.empty(1, dtype=torch.int32)
    ops.moe_align_block_size(topk_ids, E, bs, s, e, n, expert_map)
    local = (topk_ids % 2 == 0)
    assert sorted(x for x in s[:n.item()].tolist() if x < topk_ids.numel()) == local.flatten().nonzero().flatten().tolist()
    used = e[:n.item() // bs]
    assert ((used >= 0) & (used < 4)).all()


@pytest.mark.parametrize("empty", [False, True])
def test_batched_moe_align_block_size(empty):
    m, E, bs = 16, 6, 8
    counts = torch.randint(0, m, (E,), dtype=torch.int32)
    if empty:
        counts[::2] = 0
    cap = -(-max(m, bs) * E // bs) * bs
    s, e, n = torch.empty(cap, dtype=torch.int32), torch.empty(cap // bs, dtype=torch.int32), \
        torch.empty(1, dtype=torch.int32)
    ops.batched_moe_align_block_size(m, bs, counts, s, e, n)
    rs, rexp = torch.full((cap,), E * m, dtype=torch.int32), torch.full((cap // bs,), -1, dtype=torch.int32)
    i = blk = 0
    for ex, c in enumerate(counts.tolist()):
        rs[i:i + c] = torch.arange(c) + ex * m
        nb = -(-c // bs)
        rexp[blk:blk + nb] = ex
        i, blk = i + nb * bs, blk + nb
    assert torch.equal(s, rs) and torch.equal(e, rexp) and n.item() == i
