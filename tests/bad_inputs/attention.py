import torch

import llmkern

OPS = ["flash_attn_varlen_func", "flash_attn_with_kvcache"]

f = llmkern.flash_attn_varlen_func
fk = llmkern.flash_attn_with_kvcache
_CU = lambda: torch.tensor([0, 3, 5], dtype=torch.int32)  # noqa: E731


def _varlen(**over):
    args = dict(q=torch.randn(5, 4, 16), k=torch.randn(5, 2, 16), v=torch.randn(5, 2, 16),
                cu_seqlens_q=_CU(), cu_seqlens_k=_CU(), max_seqlen_q=3, max_seqlen_k=3)
    args.update(over)
    return lambda: f(**args)


def _paged(**over):
    # caches of 4 blocks x 4 slots; sequences of 3 and 6 cached keys
    args = dict(q=torch.randn(5, 4, 16), k=torch.randn(4, 4, 2, 16), v=torch.randn(4, 4, 2, 16),
                cu_seqlens_q=_CU(), cu_seqlens_k=torch.tensor([0, 3, 9], dtype=torch.int32),
                max_seqlen_q=3, max_seqlen_k=6,
                block_table=torch.tensor([[0, -1], [2, 1]], dtype=torch.int32))
    args.update(over)
    return lambda: f(**args)


def _kv(**over):
    args = dict(q=torch.randn(2, 1, 4, 16), k_cache=torch.randn(2, 8, 2, 16),
                v_cache=torch.randn(2, 8, 2, 16), cache_seqlens=torch.tensor([3, 5], dtype=torch.int32))
    args.update(over)
    return lambda: fk(**args)


def _kvp(**over):
    args = dict(q=torch.randn(2, 1, 4, 16), k_cache=torch.randn(4, 4, 2, 16),
                v_cache=torch.randn(4, 4, 2, 16), cache_seqlens=torch.tensor([3, 5], dtype=torch.int32),
                block_table=torch.tensor([[0, 3], [2, 1]], dtype=torch.int32))
    args.update(over)
    return lambda: fk(**args)


CASES = [
    # flash_attn_varlen_func
    ("va-q-rank", _varlen(q=torch.randn(5, 64)), ValueError, "q"),
    ("va-q-int", _varlen(q=torch.zeros(5, 4, 16, dtype=torch.int32)), TypeError, "q"),
    ("va-q-float64", _varlen(q=torch.randn(5, 4, 16, dtype=torch.float64)), TypeError, "q"),
    ("va-k-dtype", _varlen(k=torch.randn(5, 2, 16).half()), TypeError, "k"),
    ("va-v-shape", _varlen(v=torch.randn(5, 2, 8)), ValueError, "v"),
    ("va-headdim-too-big", _varlen(q=torch.randn(5, 4, 300), k=torch.randn(5, 2, 300), v=torch.randn(5, 2, 300)), ValueError, "head_dim"),
    ("va-dropout", _varlen(dropout_p=0.1), NotImplementedError, "dropout_p"),
    ("va-headdim-big", _varlen(q=torch.randn(5, 4, 264), k=torch.randn(5, 2, 264), v=torch.randn(5, 2, 264)), ValueError, "q"),
    ("va-k-headdim", _varlen(k=torch.randn(5, 2, 8), v=torch.randn(5, 2, 8)), ValueError, "k"),
    ("va-gqa", _varlen(q=torch.randn(5, 3, 16)), ValueError, "k"),
    ("va-q-noncontig", _varlen(q=torch.randn(5, 16, 4).transpose(1, 2)), ValueError, "q"),
    ("va-cuq-float", _varlen(cu_seqlens_q=torch.tensor([0.0, 3, 5])), TypeError, "cu_seqlens_q"),
    ("va-cuk-len", _varlen(cu_seqlens_k=torch.tensor([0, 5], dtype=torch.int32)), ValueError, "cu_seqlens_k"),
    ("va-cuq-decreasing", _varlen(cu_seqlens_q=torch.tensor([0, 3, 2], dtype=torch.int32)), ValueError, "cu_seqlens_q"),
    ("va-cuq-negative", _varlen(cu_seqlens_q=torch.tensor([-1, 3, 5], dtype=torch.int32), max_seqlen_q=4), ValueError, "cu_seqlens_q"),
    ("va-cuq-total", _varlen(cu_seqlens_q=torch.tensor([0, 3, 7], dtype=torch.int32), max_seqlen_q=4), ValueError, "cu_seqlens_q"),
    ("va-cuk-total", _varlen(cu_seqlens_k=torch.tensor([0, 3, 7], dtype=torch.int32), max_seqlen_k=4), ValueError, "cu_seqlens_k"),
    ("va-cuq-2d", _varlen(cu_seqlens_q=torch.tensor([[0, 3, 5]], dtype=torch.int32)), ValueError, "cu_seqlens_q"),
    ("va-maxq-small", _varlen(max_seqlen_q=2), ValueError, "max_seqlen_q"),
    ("va-maxk-negative", _varlen(max_seqlen_k=-1), ValueError, "max_seqlen_k"),
    ("va-window", _varlen(window_size=(-2, 0)), ValueError, "window_size"),
    ("va-window-shape", _varlen(window_size=3), ValueError, "window_size"),
    ("va-softcap", _varlen(softcap=-1.0), ValueError, "softcap"),
    ("va-scale-nan", _varlen(softmax_scale=float("nan")), ValueError, "softmax_scale"),
    ("va-scale-zero", _varlen(softmax_scale=0.0), ValueError, "softmax_scale"),
    ("va-alibi-shape", _varlen(alibi_slopes=torch.rand(3)), ValueError, "alibi_slopes"),
    ("va-alibi-batch", _varlen(alibi_slopes=torch.rand(3, 4)), ValueError, "alibi_slopes"),
    ("va-alibi-dtype", _varlen(alibi_slopes=torch.rand(4).half()), TypeError, "alibi_slopes"),
    ("va-out-shape", _varlen(out=torch.empty(5, 4, 8)), ValueError, "out"),
    ("va-out-dtype", _varlen(out=torch.empty(5, 4, 16).half()), TypeError, "out"),
    ("va-not-tensor", _varlen(k=[[1.0]]), TypeError, "k"),
    ("va-paged-k-rank", _paged(k=torch.randn(16, 2, 16), v=torch.randn(16, 2, 16)), ValueError, "k"),
    ("va-paged-block-range", _paged(block_table=torch.tensor([[0, -1], [2, 4]], dtype=torch.int32)), ValueError, "block_table"),
    ("va-paged-block-negative", _paged(block_table=torch.tensor([[-1, 0], [2, 1]], dtype=torch.int32)), ValueError, "block_table"),
    ("va-paged-capacity", _paged(cu_seqlens_k=torch.tensor([0, 3, 12], dtype=torch.int32), max_seqlen_k=9), ValueError, "cu_seqlens_k"),
    ("va-paged-table-rank", _paged(block_table=torch.tensor([0, 1], dtype=torch.int32)), ValueError, "block_table"),
    ("va-paged-table-dtype", _paged(block_table=torch.tensor([[0.0, 1.0], [2.0, 3.0]])), TypeError, "block_table"),
    ("va-paged-table-batch", _paged(block_table=torch.tensor([[0, 1]], dtype=torch.int32)), ValueError, "block_table"),
    # flash_attn_with_kvcache
    ("kv-q-rank", _kv(q=torch.randn(2, 4, 16)), ValueError, "q"),
    ("kv-cache-dtype", _kv(k_cache=torch.randn(2, 8, 2, 16).bfloat16()), TypeError, "k_cache"),
    ("kv-vcache-shape", _kv(v_cache=torch.randn(2, 6, 2, 16)), ValueError, "v_cache"),
    ("kv-headdim", _kv(k_cache=torch.randn(2, 8, 2, 8), v_cache=torch.randn(2, 8, 2, 8)), ValueError, "k_cache"),
    ("kv-gqa", _kv(q=torch.randn(2, 1, 3, 16)), ValueError, "k_cache"),
    ("kv-batch", _kv(k_cache=torch.randn(3, 8, 2, 16), v_cache=torch.randn(3, 8, 2, 16)), ValueError, "k_cache"),
    ("kv-k-without-v", _kv(k=torch.randn(2, 1, 2, 16)), ValueError, "v"),
    ("kv-k-shape", _kv(k=torch.randn(2, 1, 3, 16), v=torch.randn(2, 1, 3, 16)), ValueError, "k"),
    ("kv-k-dtype", _kv(k=torch.randn(2, 1, 2, 16).half(), v=torch.randn(2, 1, 2, 16).half()), TypeError, "k"),
    ("kv-seqlens-big", _kv(cache_seqlens=torch.tensor([3, 9], dtype=torch.int32)), ValueError, "cache_seqlens"),
    ("kv-seqlens-negative", _kv(cache_seqlens=torch.tensor([3, -1], dtype=torch.int32)), ValueError, "cache_seqlens"),
    ("kv-seqlens-append", _kv(cache_seqlens=torch.tensor([3, 8], dtype=torch.int32), k=torch.randn(2, 1, 2, 16), v=torch.randn(2, 1, 2, 16)), ValueError, "cache_seqlens"),
    ("kv-seqlens-shape", _kv(cache_seqlens=torch.tensor([3], dtype=torch.int32)), ValueError, "cache_seqlens"),
    ("kv-seqlens-dtype", _kv(cache_seqlens=torch.tensor([3.0, 5.0])), TypeError, "cache_seqlens"),
    ("kv-append-no-seqlens", _kv(cache_seqlens=None, k=torch.randn(2, 1, 2, 16), v=torch.randn(2, 1, 2, 16)), ValueError, "cache_seqlens"),
    ("kv-splits-negative", _kv(num_splits=-1), ValueError, "num_splits"),
    ("kv-splits-type", _kv(num_splits=1.5), TypeError, "num_splits"),
    ("kv-window", _kv(window_size=(0, -3)), ValueError, "window_size"),
    ("kv-softcap", _kv(softcap=float("inf")), ValueError, "softcap"),
    ("kv-alibi-shape", _kv(alibi_slopes=torch.rand(2, 3)), ValueError, "alibi_slopes"),
    ("kv-out-shape", _kv(out=torch.empty(2, 2, 4, 16)), ValueError, "out"),
    ("kv-paged-range", _kvp(block_table=torch.tensor([[0, 3], [2, 7]], dtype=torch.int32)), ValueError, "block_table"),
    ("kv-paged-capacity", _kvp(cache_seqlens=torch.tensor([3, 9], dtype=torch.int32)), ValueError, "cache_seqlens"),
    ("kv-paged-block-size-0", _kvp(k_cache=torch.randn(4, 0, 2, 16), v_cache=torch.randn(4, 0, 2, 16)), ValueError, "k_cache"),
    ("kv-not-tensor", _kv(v_cache=None), TypeError, "v_cache"),
    ("kv-paged-bounds-is-runtime-error", _kvp(cache_seqlens=torch.tensor([3, 9], dtype=torch.int32)), RuntimeError, "block_table"),
    ("kv-rotary-without-new-kv", _kv(rotary_cos=torch.randn(8, 8), rotary_sin=torch.randn(8, 8)), ValueError, "rotary_cos"),
    ("kv-rotary-sin-missing", _kv(rotary_cos=torch.randn(8, 8)), ValueError, "rotary"),
    ("kv-batch-idx-range", _kv(cache_batch_idx=torch.tensor([0, 7], dtype=torch.int32)), ValueError, "cache_batch_idx"),
    ("kv-batch-idx-paged", _kvp(cache_batch_idx=torch.tensor([0, 1], dtype=torch.int32)), NotImplementedError, "cache_batch_idx"),
    ("kv-leftpad-paged", _kvp(cache_leftpad=torch.tensor([0, 1], dtype=torch.int32)), NotImplementedError, "cache_leftpad"),
    ("kv-leftpad-past-len", _kv(cache_leftpad=torch.tensor([0, 99], dtype=torch.int32)), ValueError, "cache_leftpad"),
    ("kv-leftpad-dtype", _kv(cache_leftpad=torch.tensor([0.0, 1.0])), TypeError, "cache_leftpad"),
]

# ---- corpus of issue 14: aliasing, wrapped 64-bit indices, exception types, argument messages ----
_I64 = 2**32  # an int64 entry this large would wrap to a small int32 one


def _mha(**over):
    """q, k, v of one shape, so that out= can alias any of them."""
    return _varlen(**{"k": torch.randn(5, 4, 16), "v": torch.randn(5, 4, 16), **over})


def _out_overlaps_v():
    buf = torch.randn(10, 4, 16)
    return _mha(v=buf[:5], out=buf[2:7])


def _kv_append(**over):
    return _kv(**{"k": torch.randn(2, 1, 2, 16), "v": torch.randn(2, 1, 2, 16), **over})


def _kv_cache_alias():
    c = torch.randn(2, 8, 2, 16)
    return _kv_append(k_cache=c, v_cache=c)


_meta = lambda *s: torch.empty(*s, device="meta")  # noqa: E731

CASES += [
    # silent garbage: outputs aliasing inputs
    ("va-out-is-k", (lambda kk: _mha(k=kk, out=kk))(torch.randn(5, 4, 16)), ValueError, "out: shares memory with k"),
    ("va-out-is-q", (lambda qq: _mha(q=qq, out=qq))(torch.randn(5, 4, 16)), ValueError, "out: shares memory with q"),
    ("va-out-overlaps-v", _out_overlaps_v(), ValueError, "out: shares memory with v"),
    ("kv-out-is-q", (lambda qq: _kv(q=qq, out=qq))(torch.randn(2, 1, 4, 16)), ValueError, "out: shares memory with q"),
    ("kv-cache-alias-append", _kv_cache_alias(), ValueError, "v_cache: shares memory with k_cache"),
    ("kv-new-k-in-cache", (lambda c: _kv_append(k_cache=c, k=c[:, 6:7]))(torch.randn(2, 8, 2, 16)),
     ValueError, "k_cache: shares memory with k"),
    # silent garbage: int64 index values that do not fit the kernels' int32
    ("va-cuq-int64-wrap", _varlen(cu_seqlens_q=torch.tensor([0, 3, 5 + _I64])), ValueError, "cu_seqlens_q"),
    ("va-cuk-int64-wrap", _varlen(cu_seqlens_k=torch.tensor([0, 3 + _I64, 5 + _I64])), ValueError, "cu_seqlens_k"),
    ("va-paged-block-int64-wrap", _paged(block_table=torch.tensor([[0, -1], [2 + _I64, 1]])), ValueError, "block_table"),
    ("va-paged-unused-int64-huge", _paged(block_table=torch.tensor([[0, 2**40], [2, 1]])), ValueError, "block_table"),
    ("kv-seqlens-int64-wrap", _kv(cache_seqlens=torch.tensor([3, 5 + _I64])), ValueError, "cache_seqlens"),
    ("kv-paged-block-int64-wrap", _kvp(block_table=torch.tensor([[0, 3], [2 + _I64, 1]])), ValueError, "block_table"),
    ("kv-seqlens-int-huge", _kv(cache_seqlens=2**40), ValueError, "cache_seqlens"),
    # wrong exception types
    ("va-q-0d", _varlen(q=torch.tensor(1.0)), ValueError, "q"),
    ("kv-q-0d", _kv(q=torch.tensor(1.0)), ValueError, "q"),
    ("va-headdim-0", _varlen(q=torch.randn(5, 4, 0), k=torch.randn(5, 2, 0), v=torch.randn(5, 2, 0)), ValueError, "head_dim"),
    ("kv-headdim-0", _kv(q=torch.randn(2, 1, 4, 0), k_cache=torch.randn(2, 8, 2, 0), v_cache=torch.randn(2, 8, 2, 0)),
     ValueError, "head_dim"),
    ("va-q-meta", _varlen(q=_meta(5, 4, 16)), ValueError, "q: tensors on device 'meta'"),
    ("va-k-meta", _varlen(k=_meta(5, 2, 16)), ValueError, "k: tensors on device 'meta'"),
    ("va-cuq-meta", _varlen(cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int32, device="meta")),
     ValueError, "cu_seqlens_q: tensors on device 'meta'"),
    ("va-out-meta", _varlen(out=_meta(5, 4, 16)), ValueError, "out: tensors on device 'meta'"),
    ("kv-kcache-meta", _kv(k_cache=_meta(2, 8, 2, 16)), ValueError, "k_cache: tensors on device 'meta'"),
    ("kv-seqlens-meta", _kv(cache_seqlens=torch.tensor([3, 5], device="meta")), ValueError, "cache_seqlens: tensors on device 'meta'"),
    # unclear messages: wrong Python types for scalars and tensors
    ("va-maxq-none", _varlen(max_seqlen_q=None), TypeError, "max_seqlen_q"),
    ("va-maxk-huge", _varlen(max_seqlen_k=2**70), ValueError, "max_seqlen_k"),
    ("va-maxq-float", _varlen(max_seqlen_q=3.5), TypeError, "max_seqlen_q"),
    ("va-scale-str", _varlen(softmax_scale="x"), TypeError, "softmax_scale"),
    ("va-softcap-str", _varlen(softcap="x"), TypeError, "softcap"),
    ("va-window-huge", _varlen(window_size=(2**70, 0)), ValueError, "window_size"),
    ("va-cuq-none", _varlen(cu_seqlens_q=None), TypeError, "cu_seqlens_q"),
    ("va-q-none", _varlen(q=None), TypeError, "q"),
    ("kv-splits-huge", _kv(num_splits=2**70), ValueError, "num_splits"),
    ("kv-scale-str", _kv(softmax_scale="x"), TypeError, "softmax_scale"),
    ("kv-seqlens-str", _kv(cache_seqlens="3"), TypeError, "cache_seqlens"),
    ("kv-block-table-list", _kv(block_table=[[0, 1]]), TypeError, "block_table"),
]
