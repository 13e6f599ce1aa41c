"""Counts past the CUDA grid's 65,535 limit on y and z: sequences (prefill, decode and split-KV
combine put the batch on z / y) and copy_blocks pairs (on y). The kernels are launched once per
chunk of 65,535; the sequences and pairs past the first chunk must be computed, and computed
right. Tiny rows keep this quick on the emulator: almost every sequence is empty, a few at the
chunk edges are not."""
import pytest
import torch

import llmkern
from reference import ref_attention, ref_kvcache

B = 65_537  # one full chunk, then 2 more
LIVE = (0, 65_534, 65_535, B - 1)  # sequences that get rows: both edges of the chunk boundary


def _cu(lens, dev):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)


def _check(out, lse, q, k, v, cu_q, cu_k, scale, causal, dtype):
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in LIVE:
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        ref, ref_lse = ref_attention(q[q0:q1].cpu(), k[k0:k1].cpu(), v[k0:k1].cpu(), scale, causal=causal)
        same, _ = ref_attention(q[q0:q1].cpu(), k[k0:k1].cpu(), v[k0:k1].cpu(), scale, causal=causal,
                                compute_dtype=dtype)
        err = (out[q0:q1].float().cpu() - ref).abs().max().item()
        tol = 2 * (same - ref).abs().max().item() + 2e-3
        assert err <= tol, f"sequence {b}: max error {err:.3g} > {tol:.3g}"
        assert (lse[:, q0:q1].cpu() - ref_lse).abs().max().item() < 1e-3, f"sequence {b}: lse"


@pytest.mark.parametrize("sq,sk", [(40, 40), (1, 40)], ids=["prefill", "decode"])
def test_varlen_batch_past_grid_limit(backend, sq, sk):
    """sq = 40 rows per kv head takes the prefill kernel, sq = 1 the decode kernel."""
    dev, dtype = backend.device, torch.float16
    lens_q, lens_k = [0] * B, [0] * B
    for b in LIVE:
        lens_q[b], lens_k[b] = sq, sk
    cu_q, cu_k = _cu(lens_q, dev), _cu(lens_k, dev)
    q = torch.randn(sum(lens_q), 2, 64, device=dev).to(dtype)
    k = torch.randn(sum(lens_k), 1, 64, device=dev).to(dtype)
    v = torch.randn(sum(lens_k), 1, 64, device=dev).to(dtype)
    out, lse = llmkern.flash_attn_varlen_func(q, k, v, cu_q, cu_k, sq, sk, causal=True, return_softmax_lse=True)
    _check(out, lse, q, k, v, cu_q, cu_k, 64 ** -0.5, True, dtype)


def test_kvcache_split_combine_batch_past_grid_limit(backend):
    """Decode with num_splits = 2: the decode kernel writes partials, the combine kernel (batch on
    grid y) merges them. Paged, one block per sequence; empty sequences point at block 0."""
    dev, dtype = backend.device, torch.float16
    n = 40
    k_cache = torch.randn(len(LIVE) + 1, n, 1, 8, device=dev).to(dtype)
    v_cache = torch.randn(len(LIVE) + 1, n, 1, 8, device=dev).to(dtype)
    table = torch.zeros(B, 1, dtype=torch.int32)
    seqlens = torch.zeros(B, dtype=torch.int32)
    for i, b in enumerate(LIVE):
        table[b, 0], seqlens[b] = i + 1, n
    q = torch.randn(B, 1, 1, 8, device=dev).to(dtype)
    out, lse = llmkern.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens.to(dev),
                                               block_table=table.to(dev), num_splits=2,
                                               return_softmax_lse=True)
    idx = torch.tensor(LIVE)
    for sel in (idx, torch.tensor([1, 65_536 - 2])):  # live sequences, and a few empty ones
        qs, ts, ls = q.cpu()[sel], table[sel], seqlens[sel]
        ref, ref_lse, _, _ = ref_kvcache(qs, k_cache.cpu(), v_cache.cpu(), ls, 8 ** -0.5, block_table=ts)
        same, _, _, _ = ref_kvcache(qs, k_cache.cpu(), v_cache.cpu(), ls, 8 ** -0.5, block_table=ts,
                                    compute_dtype=dtype)
        err = (out.cpu()[sel].float() - ref).abs().max().item()
        assert err <= 2 * (same - ref).abs().max().item() + 2e-3
        fin = torch.isfinite(ref_lse)
        assert torch.equal(torch.isinf(lse.cpu()[sel]), ~fin)
        if fin.any():
            assert (lse.cpu()[sel][fin] - ref_lse[fin]).abs().max().item() < 1e-3


def test_copy_blocks_pairs_past_grid_limit(backend):
    """70,000 pairs (grid y) of 8-byte blocks: every pair past the first 65,535 is copied too."""
    dev = backend.device
    pairs = 70_000
    kc = torch.randn(2 * pairs, 1, 1, 4, device=dev).to(torch.float16)
    vc = torch.randn(2 * pairs, 1, 1, 4, device=dev).to(torch.float16)
    src = torch.randperm(pairs) + pairs
    mapping = torch.stack([src, torch.arange(pairs)], 1).to(torch.int64)
    ref_k, ref_v = kc.cpu().clone(), vc.cpu().clone()
    ref_k[mapping[:, 1]], ref_v[mapping[:, 1]] = ref_k[mapping[:, 0]], ref_v[mapping[:, 0]]  # sources, targets disjoint
    llmkern.copy_blocks([kc], [vc], mapping.to(dev))
    assert torch.equal(kc.cpu(), ref_k) and torch.equal(vc.cpu(), ref_v)
