"""llmkern.compat.flashinfer's attention API (FlashInfer 0.6.x): single prefill / decode, the
paged decode, paged prefill and ragged prefill wrappers (plan / run), merge_state and
append_paged_kv_cache, against fp64 references of FlashInfer's semantics (flashinfer_reference.py)
on every backend (cpu, simt)."""
import inspect

import pytest
import torch

import llmkern.compat.flashinfer as flashinfer
from flashinfer_reference import attend, paged

TOL = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}
MODES = ["NONE", "ROPE_LLAMA", "ALIBI"]


def close(got, ref, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(got.double(), ref.double(), atol=tol, rtol=tol)


def lse_close(got, ref):
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(got), fin)
    torch.testing.assert_close(got[fin].double(), ref[fin], atol=2e-3, rtol=1e-3)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("mode", MODES)
def test_single_decode(backend, dtype, layout, mode):
    q, k, v = rand(4, 32, dtype=dtype), rand(21, 2, 32, dtype=dtype), rand(21, 2, 32, dtype=dtype)
    kk, vv = (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()) if layout == "HND" else (k, v)
    o, lse = flashinfer.single_decode_with_kv_cache(q, kk, vv, kv_layout=layout, pos_encoding_mode=mode,
                                                   return_lse=True)
    ro, rl = attend(q[None], k, v, mode=mode)
    assert o.dtype == dtype and o.shape == (4, 32) and lse.shape == (4,)
    close(o, ro[0], dtype)
    lse_close(lse, rl[0])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("opts", [{}, {"window_left": 5}, {"logits_soft_cap": 2.0}, {"sm_scale": 0.3},
                                  {"pos_encoding_mode": "ROPE_LLAMA"}, {"pos_encoding_mode": "ALIBI"}])
def test_single_prefill(backend, causal, opts):
    q, k, v = rand(6, 4, 40), rand(11, 2, 40), rand(11, 2, 40)
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, return_lse=True, **opts)
    ro, rl = attend(q, k, v, causal=causal, mode=opts.get("pos_encoding_mode", "NONE"),
                    window_left=opts.get("window_left", -1), soft_cap=opts.get("logits_soft_cap", 0.0),
                    sm_scale=opts.get("sm_scale"))
    close(o, ro, torch.float32)
    lse_close(lse, rl)
    o2, lse2 = flashinfer.single_prefill_with_kv_cache_return_lse(q, k, v, causal=causal, **opts)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


def _seqs(lens, h, d, dtype, gen):
    return ([torch.randn(n, h, d, generator=gen).to(dtype) for n in lens],
            [torch.randn(n, h, d, generator=gen).to(dtype) for n in lens])


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_batch_decode(backend, page_size, layout, mode, dtype):
    gen = torch.Generator().manual_seed(1)
    lens = [17, 1, 40, 5]
    ks, vs = _seqs(lens, 2, 32, dtype, gen)
    cache, indptr, indices, last = paged(ks, vs, page_size, layout, gen=gen)
    q = torch.randn(len(lens), 8, 32, generator=gen).to(dtype)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8), layout)
    w.plan(indptr, indices, last, 8, 2, 32, page_size, pos_encoding_mode=mode, logits_soft_cap=3.0,
           data_type=dtype)
    o, lse = w.run(q, cache, return_lse=True)
    assert o.shape == q.shape and lse.shape == (len(lens), 8)
    for b in range(len(lens)):
        ro, rl = attend(q[b:b + 1], ks[b], vs[b], mode=mode, soft_cap=3.0)
        close(o[b], ro[0], dtype)
        lse_close(lse[b], rl[0])
    out, lse_buf = torch.empty_like(o), torch.empty_like(lse)
    assert w.run(q, cache, out=out, lse=lse_buf) is out
    assert torch.equal(out, o) and torch.equal(lse_buf, lse)
    # (k, v) pair of caches, strided views
    kv = (cache[:, 0], cache[:, 1])
    assert torch.equal(w.run(q, kv), o)


def test_batch_decode_window_and_empty_sequence(backend):
    gen = torch.Generator().manual_seed(2)
    lens = [9, 0, 30]
    ks, vs = _seqs(lens, 1, 16, torch.float32, gen)
    cache, indptr, indices, last = paged(ks, vs, 4, gen=gen)
    q = torch.randn(3, 2, 16, generator=gen)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8))
    w.plan(indptr, indices, last, 2, 1, 16, 4, window_left=6)
    o, lse = w.run(q, cache, return_lse=True)
    for b in (0, 2):
        ro, rl = attend(q[b:b + 1], ks[b], vs[b], window_left=6)
        close(o[b], ro[0], torch.float32)
        lse_close(lse[b], rl[0])
    assert torch.equal(o[1], torch.zeros_like(o[1])) and torch.isneginf(lse[1]).all()


@pytest.mark.parametrize("page_size", [1, 5, 16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_batch_prefill_paged(backend, page_size, layout, causal, mode):
    gen = torch.Generator().manual_seed(3)
    kv_lens, qo_lens = [13, 30, 7], [13, 4, 1]
    ks, vs = _seqs(kv_lens, 2, 24, torch.float32, gen)
    cache, indptr, indices, last = paged(ks, vs, page_size, layout, gen=gen)
    qo_indptr = torch.tensor([0, 13, 17, 18], dtype=torch.int32)
    q = torch.randn(18, 4, 24, generator=gen)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8), layout)
    w.plan(qo_indptr, indptr, indices, last, 4, 2, 24, page_size, causal=causal, pos_encoding_mode=mode)
    # ALIBI without causal: FlashInfer's signed bias (keys after the query rewarded), which the
    # kernels cannot express, runs on the torch path (_signed_alibi) and must match the reference.
    o, lse = w.run(q, cache, return_lse=True)
    for b in range(3):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        ro, rl = attend(q[rows], ks[b], vs[b], causal=causal, mode=mode)
        close(o[rows], ro, torch.float32)
        lse_close(lse[rows], rl)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_batch_prefill_ragged(backend, causal, mode):
    gen = torch.Generator().manual_seed(4)
    qo_lens, kv_lens = [5, 1, 9], [5, 12, 20]
    q = torch.randn(sum(qo_lens), 4, 32, generator=gen).half()
    k = torch.randn(sum(kv_lens), 1, 32, generator=gen).half()
    v = torch.randn(sum(kv_lens), 1, 32, generator=gen).half()
    qo_indptr = torch.tensor([0, 5, 6, 15], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 5, 17, 37], dtype=torch.int32)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(16, dtype=torch.uint8))
    w.plan(qo_indptr, kv_indptr, 4, 1, 32, causal=causal, pos_encoding_mode=mode, window_left=8)
    o = w.run(q, k, v)
    for b in range(3):
        qr, kr = slice(int(qo_indptr[b]), int(qo_indptr[b + 1])), slice(int(kv_indptr[b]), int(kv_indptr[b + 1]))
        ro, _ = attend(q[qr], k[kr], v[kr], causal=causal, mode=mode, window_left=8)
        close(o[qr], ro, torch.float16)


def test_merge_state_recovers_full_attention(backend):
    q, k, v = rand(6, 4, 16), rand(20, 4, 16), rand(20, 4, 16)
    va, sa = flashinfer.single_prefill_with_kv_cache(q, k[:8], v[:8], return_lse=True)
    vb, sb = flashinfer.single_prefill_with_kv_cache(q, k[8:], v[8:], return_lse=True)
    vm, sm = flashinfer.merge_state(va, sa, vb, sb)
    vf, sf = flashinfer.single_prefill_with_kv_cache(q, k, v, return_lse=True)
    torch.testing.assert_close(vm, vf, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sm, sf, atol=1e-5, rtol=1e-5)
    vs, ss = flashinfer.merge_states(torch.stack([va, vb], 1), torch.stack([sa, sb], 1))
    torch.testing.assert_close(vs, vf, atol=1e-5, rtol=1e-5)
    flashinfer.merge_state_in_place(va, sa, vb, sb)
    torch.testing.assert_close(va, vf, atol=1e-5, rtol=1e-5)


def test_merge_state_with_empty_state():
    v = torch.randn(3, 2, 8)
    s = torch.randn(3, 2)
    vm, sm = flashinfer.merge_state(v, s, torch.zeros_like(v), torch.full_like(s, float("-inf")))
    torch.testing.assert_close(vm, v)
    torch.testing.assert_close(sm, s)
    vm, sm = flashinfer.merge_state(v, torch.full_like(s, float("-inf")), v, torch.full_like(s, float("-inf")))
    assert torch.equal(vm, torch.zeros_like(v)) and torch.isneginf(sm).all()


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_append_paged_kv_cache_then_decode(backend, layout):
    gen = torch.Generator().manual_seed(5)
    page_size, old, new = 4, [3, 8], [2, 5]
    ks, vs = _seqs([o + n for o, n in zip(old, new)], 2, 16, torch.float32, gen)
    cache, indptr, indices, last = paged(ks, vs, page_size, layout, gen=gen)
    full = cache.clone()
    # wipe the new tokens' slots, then write them back through append_paged_kv_cache
    seq_lens = flashinfer.get_seq_lens(indptr, last, page_size)
    assert seq_lens.tolist() == [5, 13]
    append_indptr = torch.tensor([0, 2, 7], dtype=torch.int32)
    bi, pos = flashinfer.get_batch_indices_positions(append_indptr, seq_lens, 7)
    assert bi.tolist() == [0, 0, 1, 1, 1, 1, 1] and pos.tolist() == [3, 4, 8, 9, 10, 11, 12]
    new_k = torch.cat([ks[0][3:], ks[1][8:]])
    new_v = torch.cat([vs[0][3:], vs[1][8:]])
    k_view = cache[:, 0] if layout == "NHD" else cache[:, 0].transpose(1, 2)
    for b, p in zip(bi.tolist(), pos.tolist()):
        k_view[int(indices[int(indptr[b]) + p // page_size]), p % page_size] = 0
    flashinfer.append_paged_kv_cache(new_k, new_v, bi, pos, cache, indices, indptr, last, kv_layout=layout)
    assert torch.equal(cache, full)


def test_cuda_graph_plan_keeps_storage():
    gen = torch.Generator().manual_seed(6)
    ks, vs = _seqs([9, 4], 1, 16, torch.float32, gen)
    cache, indptr, indices, last = paged(ks, vs, 4, gen=gen)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8), use_cuda_graph=True,
                                                      paged_kv_indices_buffer=torch.empty(8, dtype=torch.int32))
    assert w.is_cuda_graph_enabled
    w.plan(indptr, indices, last, 1, 1, 16, 4)
    table = w._plan.block_table
    w.plan(indptr, indices.flip(0), last, 1, 1, 16, 4)
    assert w._plan.block_table.data_ptr() == table.data_ptr()


def test_errors():
    q, k = rand(2, 16), rand(5, 1, 16)
    with pytest.raises(KeyError, match="Invalid kv_layout"):
        flashinfer.single_decode_with_kv_cache(q, k, k, kv_layout="NDH")
    with pytest.raises(KeyError, match="Invalid pos_encoding_mode"):
        flashinfer.single_decode_with_kv_cache(q, k, k, pos_encoding_mode="ROPE")
    with pytest.raises(NotImplementedError, match="fp8"):
        flashinfer.single_decode_with_kv_cache(q.to(torch.float8_e4m3fn), k, k)
    with pytest.raises(NotImplementedError, match="packed_custom_mask"):
        flashinfer.single_prefill_with_kv_cache(rand(2, 1, 16), k, k, packed_custom_mask=torch.ones(2, dtype=torch.uint8))
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="plan"):
        w.run(rand(1, 2, 16), torch.zeros(1, 2, 4, 1, 16))


@pytest.mark.parametrize("fn, params", [
    (flashinfer.single_decode_with_kv_cache, ["q", "k", "v", "kv_layout", "pos_encoding_mode", "use_tensor_cores",
                                             "q_scale", "k_scale", "v_scale", "window_left", "logits_soft_cap",
                                             "sm_scale", "rope_scale", "rope_theta", "return_lse"]),
    (flashinfer.BatchDecodeWithPagedKVCacheWrapper.plan,
     ["self", "indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads", "head_dim", "page_size",
      "pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type", "data_type",
      "sm_scale", "rope_scale", "rope_theta"]),
    (flashinfer.BatchPrefillWithPagedKVCacheWrapper.plan,
     ["self", "qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "num_qo_heads",
      "num_kv_heads", "head_dim_qk", "page_size", "head_dim_vo", "custom_mask", "packed_custom_mask", "causal",
      "pos_encoding_mode", "use_fp16_qk_reduction", "sm_scale", "window_left", "logits_soft_cap"]),
])
def test_signature_prefix_is_flashinfers(fn, params):
    assert list(inspect.signature(fn).parameters)[:len(params)] == params


def test_batch_prefill_more_queries_than_keys(backend):
    """Non-causal: a sequence may have more queries than keys (FlashInfer allows it; query i sits
    at kv_len - qo_len + i, negative for the first ones, which ROPE_LLAMA rotates as such)."""
    gen = torch.Generator().manual_seed(7)
    ks, vs = _seqs([5], 1, 16, torch.float32, gen)
    cache, indptr, indices, last = paged(ks, vs, 2, gen=gen)
    q = torch.randn(9, 2, 16, generator=gen)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8))
    w.plan(torch.tensor([0, 9], dtype=torch.int32), indptr, indices, last, 2, 1, 16, 2,
           pos_encoding_mode="ROPE_LLAMA")
    ro, _ = attend(q, ks[0], vs[0], mode="ROPE_LLAMA")
    close(w.run(q, cache), ro, torch.float32)
    # Causal too (current FlashInfer): the first 4 queries see no key, out 0 (the reference's too).
    w.plan(torch.tensor([0, 9], dtype=torch.int32), indptr, indices, last, 2, 1, 16, 2, causal=True)
    ro, _ = attend(q, ks[0], vs[0], causal=True)
    close(w.run(q, cache), ro, torch.float32)
