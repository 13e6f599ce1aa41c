"""llmkern.compat.flashinfer's custom_mask (FlashInfer's boolean mask, True = attend, replacing
the causal mask) on single prefill and the ragged / paged prefill wrappers, against the fp64
reference of flashinfer_reference.py, on every backend (the masked calls run on the torch path)."""
import pytest
import torch

import llmkern.compat.flashinfer as flashinfer
from flashinfer_reference import attend, paged

TOL = {torch.float32: 2e-4, torch.float16: 4e-3}


def _ws():
    return torch.empty(16, dtype=torch.uint8)


def _check(o, lse, ref_o, ref_lse, dtype):
    torch.testing.assert_close(o.double(), ref_o, atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    fin = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[fin].double(), ref_lse[fin], atol=3e-3, rtol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("opts", [{}, {"causal": True}, {"window_left": 3}, {"pos_encoding_mode": "ROPE_LLAMA"},
                                  {"pos_encoding_mode": "ALIBI", "logits_soft_cap": 5.0}])
def test_single_prefill_custom_mask(backend, dtype, opts):
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(n, h, 32, generator=gen).to(dtype) for n, h in ((7, 4), (12, 2), (12, 2)))
    mask = torch.rand(7, 12, generator=gen) < 0.5
    mask[3] = False  # a row that sees nothing: 0 out, lse -inf
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=mask, return_lse=True, **opts)
    ro, rl = attend(q, k, v, mask=mask, window_left=opts.get("window_left", -1),
                    mode=opts.get("pos_encoding_mode", "NONE"), soft_cap=opts.get("logits_soft_cap", 0.0))
    _check(o, lse, ro, rl, dtype)
    assert torch.equal(o[3], torch.zeros_like(o[3]))


@pytest.mark.parametrize("paged_kv", [False, True])
def test_batch_prefill_custom_mask(backend, paged_kv):
    gen = torch.Generator().manual_seed(12)
    qo_lens, kv_lens = [3, 5, 1], [6, 5, 9]
    ks = [torch.randn(n, 2, 16, generator=gen) for n in kv_lens]
    vs = [torch.randn(n, 2, 16, generator=gen) for n in kv_lens]
    q = torch.randn(sum(qo_lens), 4, 16, generator=gen)
    masks = [torch.rand(a, b, generator=gen) < 0.6 for a, b in zip(qo_lens, kv_lens)]
    flat = torch.cat([m.reshape(-1) for m in masks])
    qo_indptr = torch.tensor([0, 3, 8, 9], dtype=torch.int32)
    if paged_kv:
        cache, indptr, indices, last = paged(ks, vs, 4, gen=gen)
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws())
        w.plan(qo_indptr, indptr, indices, last, 4, 2, 16, 4, custom_mask=flat)
        o, lse = w.run(q, cache, return_lse=True)
    else:
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws())
        w.plan(qo_indptr, torch.tensor([0, 6, 11, 20], dtype=torch.int32), 4, 2, 16, custom_mask=flat)
        o, lse = w.run(q, torch.cat(ks), torch.cat(vs), return_lse=True)
    for b in range(3):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        ro, rl = attend(q[rows], ks[b], vs[b], mask=masks[b])
        _check(o[rows], lse[rows], ro, rl, torch.float32)
    with pytest.raises(ValueError, match="custom_mask"):
        flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws()).plan(
            qo_indptr, torch.tensor([0, 6, 11, 20], dtype=torch.int32), 4, 2, 16, custom_mask=flat[1:])
