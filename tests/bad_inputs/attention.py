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
