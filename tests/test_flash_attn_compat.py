"""flash-attn 2.8 API compatibility: exact signatures (positional calls mean what they mean in
flash-attn), the non-varlen and packed variants, return_attn_probs, odd head dims, kvcache rotary /
cache_leftpad / cache_batch_idx in the kernels, the block-table bounds error, and the
import-compatible llmkern.compat.flash_attn modules. References are plain torch (tests/reference.py)."""
from __future__ import annotations

import inspect
import math

import pytest
import torch

import llmkern
from llmkern.compat import flash_attn as fa
from llmkern.compat.flash_attn import bert_padding
from reference import ref_attention, ref_rotary_rows, ref_varlen

TOL = dict(atol=2e-2, rtol=2e-2)


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


# ---- signatures ----------------------------------------------------------------------------------

FA_PARAMS = {
    # flash-attn 2.8.4 flash_attn_interface: positional parameters, in order, with defaults.
    "flash_attn_varlen_func": ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
                               "dropout_p", "softmax_scale", "causal", "window_size", "softcap",
                               "alibi_slopes", "deterministic", "return_attn_probs", "block_table"],
    "flash_attn_with_kvcache": ["q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin",
                                "cache_seqlens", "cache_batch_idx", "cache_leftpad", "block_table",
                                "softmax_scale", "causal", "window_size", "softcap", "rotary_interleaved",
                                "alibi_slopes", "num_splits", "return_softmax_lse"],
    "flash_attn_func": ["q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size", "softcap",
                        "alibi_slopes", "deterministic", "return_attn_probs"],
    "flash_attn_qkvpacked_func": ["qkv", "dropout_p", "softmax_scale", "causal", "window_size", "softcap",
                                  "alibi_slopes", "deterministic", "return_attn_probs"],
    "flash_attn_kvpacked_func": ["q", "kv", "dropout_p", "softmax_scale", "causal", "window_size", "softcap",
                                 "alibi_slopes", "deterministic", "return_attn_probs"],
    "flash_attn_varlen_qkvpacked_func": ["qkv", "cu_seqlens", "max_seqlen", "dropout_p", "softmax_scale",
                                         "causal", "window_size", "softcap", "alibi_slopes", "deterministic",
                                         "return_attn_probs"],
    "flash_attn_varlen_kvpacked_func": ["q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                                        "max_seqlen_k", "dropout_p", "softmax_scale", "causal", "window_size",
                                        "softcap", "alibi_slopes", "deterministic", "return_attn_probs"],
}


@pytest.mark.parametrize("name", sorted(FA_PARAMS))
def test_signature_matches_flash_attn(name):
    sig = inspect.signature(getattr(fa, name))
    positional = [p.name for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert positional == FA_PARAMS[name]
    extras = [p for p in sig.parameters.values() if p.name not in FA_PARAMS[name]]
    assert all(p.kind == p.KEYWORD_ONLY for p in extras), "llmkern extensions must be keyword-only"
    defaults = {p.name: p.default for p in sig.parameters.values()}
    for pname, want in [("dropout_p", 0.0), ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0),
                        ("deterministic", False), ("return_attn_probs", False), ("rotary_interleaved", True),
                        ("num_splits", 0)]:
        if pname in defaults:
            assert defaults[pname] == want, pname
    assert getattr(llmkern, name) is getattr(fa, name)


def test_varlen_positional_call_flash_attn_style(backend):
    torch.manual_seed(0)
    lens = [5, 9]
    q = torch.randn(sum(lens), 4, 64)
    k, v = torch.randn(sum(lens), 2, 64), torch.randn(sum(lens), 2, 64)
    cu = _cu(lens)
    # flash-attn order: ..., max_seqlen_k, dropout_p, softmax_scale, causal
    out = fa.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9, 0.0, 0.3, True)
    ref, lse_ref = ref_varlen(q, k, v, cu, cu, 0.3, causal=True)
    torch.testing.assert_close(out, ref, **TOL)
    res = fa.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9, 0.0, 0.3, True, deterministic=True,
                                    return_attn_probs=True)
    assert isinstance(res, tuple) and len(res) == 3 and res[2] is None  # S_dmask: None without dropout
    torch.testing.assert_close(res[0], ref, **TOL)
    torch.testing.assert_close(res[1], lse_ref, **TOL)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        fa.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9, 0.1)


def test_kvcache_positional_call_flash_attn_style(backend):
    torch.manual_seed(1)
    q = torch.randn(2, 1, 4, 64)
    kc, vc = torch.randn(2, 32, 2, 64), torch.randn(2, 32, 2, 64)
    lens = torch.tensor([7, 20], dtype=torch.int32)
    # k, v, rotary_cos, rotary_sin, cache_seqlens: positional, as flash-attn's callers write it.
    out = fa.flash_attn_with_kvcache(q, kc, vc, None, None, None, None, lens)
    for b, n in enumerate(lens.tolist()):
        ref, _ = ref_attention(q[b], kc[b, :n], vc[b, :n], 64 ** -0.5)
        torch.testing.assert_close(out[b], ref, **TOL)


# ---- non-varlen and packed variants --------------------------------------------------------------


def _ref_batched(q, k, v, scale, **kw):
    outs, lses = zip(*(ref_attention(q[b], k[b], v[b], scale, **kw) for b in range(q.shape[0])))
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("d", [64, 59])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_func_and_packed(backend, d, causal):
    torch.manual_seed(2)
    b, sq, sk, hq, hkv = 2, 7, 11, 4, 2
    q = torch.randn(b, sq, hq, d).to(torch.bfloat16)
    kv = torch.randn(b, sk, 2, hkv, d).to(torch.bfloat16)
    k, v = kv[:, :, 0], kv[:, :, 1]
    scale = d ** -0.5
    ref, lse_ref = _ref_batched(q, k, v, scale, causal=causal, window=(3, -1))
    out, lse, s_dmask = fa.flash_attn_func(q, k, v, causal=causal, window_size=(3, -1), return_attn_probs=True)
    assert s_dmask is None and out.shape == q.shape and lse.shape == (b, hq, sq)
    torch.testing.assert_close(out.float(), ref, **TOL)
    torch.testing.assert_close(lse, lse_ref, **TOL)
    out2 = fa.flash_attn_kvpacked_func(q, kv, 0.0, None, causal, (3, -1))
    torch.testing.assert_close(out2.float(), ref, **TOL)
    qkv = torch.randn(b, sk, 3, hkv, d).to(torch.bfloat16)
    ref3, _ = _ref_batched(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], scale, causal=causal)
    torch.testing.assert_close(fa.flash_attn_qkvpacked_func(qkv, causal=causal).float(), ref3, **TOL)


@pytest.mark.parametrize("d", [64, 40, 59])
def test_varlen_packed_and_odd_head_dim(backend, d):
    torch.manual_seed(3)
    lens_q, lens_k = [3, 8], [6, 8]
    q = torch.randn(sum(lens_q), 4, d).to(torch.float16)
    kv = torch.randn(sum(lens_k), 2, 2, d).to(torch.float16)
    cq, ck = _cu(lens_q), _cu(lens_k)
    ref, _ = ref_varlen(q, kv[:, 0], kv[:, 1], cq, ck, d ** -0.5, causal=True)
    out = fa.flash_attn_varlen_kvpacked_func(q, kv, cq, ck, 8, 8, causal=True)
    assert out.shape == q.shape
    torch.testing.assert_close(out.float(), ref, **TOL)
    buf = torch.empty_like(q)
    fa.flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cq, ck, 8, 8, causal=True, out=buf)
    torch.testing.assert_close(buf.float(), ref, **TOL)
    qkv = torch.randn(sum(lens_k), 3, 2, d).to(torch.float16)
    ref2, _ = ref_varlen(qkv[:, 0], qkv[:, 1], qkv[:, 2], ck, ck, d ** -0.5)
    torch.testing.assert_close(fa.flash_attn_varlen_qkvpacked_func(qkv, ck, 8).float(), ref2, **TOL)


# ---- kvcache: rotary, cache_leftpad, cache_batch_idx (in the kernels) ----------------------------


def _ref_kvcache_ext(q, kc, vc, k, v, lens, leftpad, batch_idx, cos, sin, interleaved, causal):
    """flash-attn's documented kvcache semantics, step by step in torch: k rotated at
    lens[b] + i and appended at row lens[b] + i of cache batch batch_idx[b]; q rotated at lens[b] + i
    (causal) or lens[b]; keys are rows leftpad[b] .. lens[b] + s_new - 1."""
    kc, vc = kc.clone().float(), vc.clone().float()
    b_, sq = q.shape[:2]
    s_new = k.shape[1]
    outs = []
    for b in range(b_):
        cb = int(batch_idx[b]) if batch_idx is not None else b
        n = int(lens[b])
        pos_k = torch.arange(n, n + s_new)
        kr = ref_rotary_rows(k[b], cos, sin, pos_k, interleaved) if cos is not None else k[b].float()
        kc[cb, n:n + s_new], vc[cb, n:n + s_new] = kr, v[b].float()
        pos_q = torch.arange(n, n + sq) if causal else torch.full((sq,), n)
        qr = ref_rotary_rows(q[b], cos, sin, pos_q, interleaved) if cos is not None else q[b].float()
        lp = int(leftpad[b]) if leftpad is not None else 0
        o, _ = ref_attention(qr, kc[cb, lp:n + s_new], vc[cb, lp:n + s_new], q.shape[-1] ** -0.5, causal=causal)
        outs.append(o)
    return torch.stack(outs), kc, vc


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rot_frac", [0.5, 1.0])
def test_kvcache_rotary_leftpad_batch_idx(backend, interleaved, causal, rot_frac):
    torch.manual_seed(4)
    b, sq, hq, hkv, d, cache_len = 2, 3, 4, 2, 64, 40
    rd = int(d * rot_frac)
    dt = torch.float16
    q = torch.randn(b, sq, hq, d).to(dt)
    k, v = torch.randn(b, sq, hkv, d).to(dt), torch.randn(b, sq, hkv, d).to(dt)
    kc, vc = torch.randn(4, cache_len, hkv, d).to(dt), torch.randn(4, cache_len, hkv, d).to(dt)
    lens = torch.tensor([9, 30], dtype=torch.int32)
    leftpad = torch.tensor([2, 11], dtype=torch.int32)
    bidx = torch.tensor([3, 1], dtype=torch.int32)
    angle = torch.rand(cache_len, rd // 2) * 2 * math.pi
    cos, sin = angle.cos().to(dt), angle.sin().to(dt)
    ref, kref, vref = _ref_kvcache_ext(q, kc, vc, k, v, lens, leftpad, bidx, cos, sin, interleaved, causal)
    kc2, vc2 = kc.clone(), vc.clone()
    out = fa.flash_attn_with_kvcache(q, kc2, vc2, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                     cache_batch_idx=bidx, cache_leftpad=leftpad, causal=causal,
                                     rotary_interleaved=interleaved)
    torch.testing.assert_close(out.float(), ref, **TOL)
    torch.testing.assert_close(kc2.float(), kref, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(vc2.float(), vref, atol=0, rtol=0)
    assert torch.equal(q, q.clone())  # q is not rotated in place


def test_kvcache_odd_head_dim_appends_into_callers_cache(backend):
    torch.manual_seed(5)
    d = 59
    q, k, v = torch.randn(2, 2, 2, d), torch.randn(2, 2, 2, d), torch.randn(2, 2, 2, d)
    kc, vc = torch.randn(2, 16, 2, d), torch.randn(2, 16, 2, d)
    lens = torch.tensor([3, 10], dtype=torch.int32)
    ref, kref, vref = _ref_kvcache_ext(q, kc, vc, k, v, lens, None, None, None, None, False, True)
    out, lse = fa.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, causal=True, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 2, 2)
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(kc, kref)
    torch.testing.assert_close(vc, vref)


def test_kvcache_extras_bad_inputs():
    q, kc = torch.randn(1, 1, 2, 64), torch.randn(1, 8, 2, 64)
    lens = torch.tensor([3], dtype=torch.int32)
    cs = torch.randn(8, 16)
    with pytest.raises(ValueError, match="rotary_cos"):  # rotary needs the appended k/v
        fa.flash_attn_with_kvcache(q, kc, kc.clone(), rotary_cos=cs, rotary_sin=cs, cache_seqlens=lens)
    kn = torch.randn(1, 1, 2, 64)
    with pytest.raises(ValueError, match="rotary_cos"):  # fewer positions than the cache has rows
        fa.flash_attn_with_kvcache(q, kc, kc.clone(), kn, kn, cs[:4], cs[:4], lens)
    with pytest.raises(ValueError, match="cache_batch_idx"):
        fa.flash_attn_with_kvcache(q, kc, kc.clone(), cache_seqlens=lens,
                                   cache_batch_idx=torch.tensor([5], dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_leftpad"):
        fa.flash_attn_with_kvcache(q, kc, kc.clone(), cache_seqlens=lens,
                                   cache_leftpad=torch.tensor([4], dtype=torch.int32))
    table = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="cache_leftpad"):
        fa.flash_attn_with_kvcache(q, kc, kc.clone(), cache_seqlens=lens, block_table=table,
                                   cache_leftpad=torch.tensor([1], dtype=torch.int32))


# ---- block-table bounds: RuntimeError (flash-attn) and ValueError (llmkern) ---------------------


@pytest.mark.parametrize("append", [False, True])
def test_block_table_bounds_error_is_runtime_and_value_error(append):
    bs = 16
    kc, vc = torch.randn(4, bs, 1, 64), torch.randn(4, bs, 1, 64)
    table = torch.zeros(1, 1, dtype=torch.int32)
    q = torch.randn(1, 1, 1, 64)
    kn = torch.randn(1, 1, 1, 64) if append else None
    lens = torch.full((1,), bs if append else bs + 1, dtype=torch.int32)
    for exc in (RuntimeError, ValueError, llmkern.IndexOutOfRangeError):
        with pytest.raises(exc, match="block_table"):
            fa.flash_attn_with_kvcache(q, kc, vc, k=kn, v=kn, cache_seqlens=lens, block_table=table)
    out = fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.full((1,), bs, dtype=torch.int32),
                                     block_table=table)
    assert not out.isnan().any()
    bad = torch.full((1, 1), 9, dtype=torch.int32)  # a block id past the cache
    with pytest.raises(RuntimeError, match="block_table"):
        fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.full((1,), 3, dtype=torch.int32), block_table=bad)


# ---- bert_padding helpers ------------------------------------------------------------------------


def test_bert_padding_roundtrip():
    torch.manual_seed(6)
    x = torch.randn(3, 5, 2, 4)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    rows, idx, cu, maxlen, used = bert_padding.unpad_input(x, mask)
    assert cu.tolist() == [0, 2, 7, 8] and maxlen == 5 and used.tolist() == [2, 5, 1]
    assert cu.dtype == torch.int32 and used.dtype == torch.int32
    torch.testing.assert_close(rows, x[mask])
    back = bert_padding.pad_input(rows, idx, 3, 5)
    torch.testing.assert_close(back, x * mask[..., None, None])
    torch.testing.assert_close(bert_padding.index_first_axis(x.reshape(15, 2, 4), idx), x[mask])
