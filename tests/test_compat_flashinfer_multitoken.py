"""llmkern.compat.flashinfer: FlashInfer's multi-token decode (``q_len_per_req``) and causal
prefill with more queries than keys, against the fp64 reference of flashinfer_reference.py on
every backend (cpu, simt). FlashInfer's own tests of these need CUDA streams and graphs."""
import pytest
import torch

import llmkern.compat.flashinfer as flashinfer
from flashinfer_reference import attend, paged

TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2}
LSE_TOL = {torch.float32: 2e-3, torch.bfloat16: 3e-2}  # bf16: q / k rounded after ROPE_LLAMA


def _seqs(lens, h, d, dtype, gen):
    return ([torch.randn(n, h, d, generator=gen).to(dtype) for n in lens],
            [torch.randn(n, h, d, generator=gen).to(dtype) for n in lens])


def _ws():
    return torch.empty(16, dtype=torch.uint8)


@pytest.mark.parametrize("mode", ["NONE", "ROPE_LLAMA", "ALIBI"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_multi_token_decode(backend, mode, dtype):
    gen = torch.Generator().manual_seed(7)
    lens, q_len = [9, 3, 20], 3
    ks, vs = _seqs(lens, 2, 32, dtype, gen)
    cache, indptr, indices, last = paged(ks, vs, 4, gen=gen)
    q = torch.randn(len(lens) * q_len, 4, 32, generator=gen).to(dtype)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD", use_tensor_cores=True)
    w.plan(indptr, indices, last, 4, 2, 32, 4, pos_encoding_mode=mode, q_len_per_req=q_len)
    o, lse = w.run(q, cache, return_lse=True)
    assert o.shape == q.shape and lse.shape == (q.shape[0], 4)
    for b in range(len(lens)):
        rows = slice(b * q_len, (b + 1) * q_len)
        ro, rl = attend(q[rows], ks[b], vs[b], causal=True, mode=mode)
        torch.testing.assert_close(o[rows].double(), ro, atol=TOL[dtype], rtol=TOL[dtype])
        torch.testing.assert_close(lse[rows].double(), rl, atol=LSE_TOL[dtype], rtol=1e-3)


def test_multi_token_decode_checks():
    gen = torch.Generator().manual_seed(8)
    ks, vs = _seqs([5, 1], 1, 16, torch.float32, gen)
    cache, indptr, indices, last = paged(ks, vs, 4, gen=gen)
    args = (indptr, indices, last, 2, 1, 16, 4)
    with pytest.raises(ValueError, match="use_tensor_cores"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws()).plan(*args, q_len_per_req=2)
    with pytest.raises(NotImplementedError, match="fa2"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), use_tensor_cores=True, backend="fa3").plan(
            *args, q_len_per_req=2)
    with pytest.raises(ValueError, match="empty KV range"):  # the second sequence has 1 key
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), use_tensor_cores=True).plan(*args, q_len_per_req=2)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), use_tensor_cores=True)
    w.plan(*args, q_len_per_req=1)
    with pytest.raises(ValueError, match="q_len_per_req"):
        w.run(torch.randn(4, 2, 16), cache)
    with pytest.raises(ValueError, match="prior plan"):
        flashinfer.fast_decode_plan(flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws()), *args)
    g = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(), use_cuda_graph=True, use_tensor_cores=True)
    g.plan(*args)
    with pytest.raises(ValueError, match="frozen"):
        g.plan(*args, q_len_per_req=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_prefill_more_queries_than_keys(backend, dtype):
    gen = torch.Generator().manual_seed(9)
    kv_lens, qo_lens = [2, 6], [5, 6]
    ks, vs = _seqs(kv_lens, 2, 16, dtype, gen)
    cache, indptr, indices, last = paged(ks, vs, 1, gen=gen)
    q = torch.randn(sum(qo_lens), 4, 16, generator=gen).to(dtype)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws())
    w.plan(torch.tensor([0, 5, 11], dtype=torch.int32), indptr, indices, last, 4, 2, 16, 1, causal=True)
    o, lse = w.run(q, cache, return_lse=True)
    assert not o.isnan().any()
    for b, rows in enumerate((slice(0, 5), slice(5, 11))):
        ro, rl = attend(q[rows], ks[b], vs[b], causal=True)
        torch.testing.assert_close(o[rows].double(), ro, atol=TOL[dtype], rtol=TOL[dtype])
        assert torch.equal(torch.isneginf(lse[rows]), torch.isneginf(rl))  # 3 rows of the first see no key
        fin = torch.isfinite(rl)
        torch.testing.assert_close(lse[rows][fin].double(), rl[fin], atol=LSE_TOL[dtype], rtol=1e-3)
    assert torch.isneginf(lse[:3]).all() and torch.equal(o[:3], torch.zeros_like(o[:3]))


def test_multi_item_scoring_is_refused_not_ignored():
    # FlashInfer's multi-item scoring masks keys between items; ignoring it would be a wrong answer.
    i32 = dict(dtype=torch.int32)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws())
    with pytest.raises(NotImplementedError, match="prefix_len_ptr"):
        w.plan(torch.tensor([0, 4], **i32), torch.tensor([0, 1], **i32), torch.tensor([0], **i32),
               torch.tensor([4], **i32), 2, 1, 16, 4, prefix_len_ptr=torch.tensor([2]))
    r = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws())
    with pytest.raises(NotImplementedError, match="token_pos_in_items_len"):
        r.plan(torch.tensor([0, 4], **i32), torch.tensor([0, 4], **i32), 2, 1, 16, token_pos_in_items_len=3)
