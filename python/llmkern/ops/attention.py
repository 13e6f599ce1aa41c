"""Attention ops (flash-attn 2 signatures) -> csrc/attention/flash_attn{.cpp,_cpu.cpp,.cu}.

Semantics follow flash-attn 2: causal masks are aligned to the bottom right (query i of a
sequence with sq queries and sk keys sits at key position i + sk - sq), the sliding window keeps
keys in ``[i + sk - sq - left, i + sk - sq + right]``, ``softcap`` maps scores to
``softcap * tanh(s / softcap)``, ALiBi adds ``-slope * |i + sk - sq - j|``, rows that see no key
give zeros (and lse = +inf). Signatures are flash-attn 2.8's, parameter for parameter; the
training-only ones are accepted at their no-op values (``dropout_p=0``, ``deterministic``: the
forward is always deterministic) and ``dropout_p > 0`` raises NotImplementedError. llmkern's own
extensions (``out=``, ``return_softmax_lse=`` on varlen) come after them, keyword-only. Head dims
that are not a multiple of 8 are zero-padded around the kernels (as flash-attn does). Beyond
flash-attn 2: any page size >= 1, fp32/fp16/bf16 on CPU (fp32 accumulation), int64 index tensors
accepted (converted to int32; an entry outside int32 raises ValueError, read on the host for CPU
tensors and for CUDA tensors under ``LLMKERN_DEBUG_CHECKS=1``). The non-varlen and packed variants
live in flash_attn_variants.py.

``out`` (and, when k/v are appended, the caches) may share no memory with any other argument:
an overlap raises ValueError. Keys a sequence does not own (other sequences' rows, the unused tail
of its last block, blocks outside its table, unused block-table entries) never affect its output,
whatever they hold. Keys inside a sequence that a query does not attend to (causal mask, sliding
window) are weighted by zero, so NaN / inf there can still reach that query (0 * NaN), as in
flash-attn and torch SDPA: keep the used part of a cache finite.

CPU notes: bf16 uses the AVX512_BF16 dot-product instructions where the CPU has them (P is then
rounded to bf16 for P.V, as on GPUs; ``LLMKERN_ATTN_BF16_DOT=0`` turns this off). Decode over a
large paged cache is limited by TLB misses on 4 KiB pages: back the cache with huge pages (for
torch's allocator, ``THP_MEM_ALLOC_ENABLE=1``) for up to ~2x the K/V read rate.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from .._args import float_arg, int_arg
from .._backend import dl, kernel_op, lib_for, require_tensor, stream_of
from ._index_args import as_int32_index
from ._splitkv import split_workspace
from .sm90_check import ensure_decided as ensure_sm90_decided, set_default_attend

__all__ = ["flash_attn_varlen_func", "flash_attn_with_kvcache"]


def _i32(t: Optional[torch.Tensor], name: str, optional: bool = False) -> Optional[torch.Tensor]:
    """Index tensors cross as int32 (as flash-attn); int64 is converted, other dtypes rejected."""
    if t is None and optional:
        return None
    return as_int32_index(t, name)


def _scale(softmax_scale, q: torch.Tensor) -> float:
    if softmax_scale is None:  # head_dim 0 is left to the kernel's head_dim check
        return float(q.shape[-1]) ** -0.5 if q.dim() and q.shape[-1] > 0 else 1.0
    return float_arg(softmax_scale, "softmax_scale")


def _no_dropout(dropout_p) -> None:
    """flash-attn's dropout_p: llmkern is inference-only, so only 0 is honoured."""
    if dropout_p is None:
        return
    try:
        p = float(dropout_p)
    except (TypeError, ValueError):
        raise TypeError(f"dropout_p: expected a float, got {type(dropout_p).__name__}") from None
    if p != 0.0:
        raise NotImplementedError(
            f"dropout_p: llmkern's attention is inference-only; dropout_p must be 0.0, got {dropout_p!r}")


def _pad_to_8(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Zero-pads the head dim to a multiple of 8 (the kernels' granule), as flash-attn does.
    Zero features change neither q.k nor (after slicing) P.V."""
    if x is None or x.shape[-1] % 8 == 0:
        return x
    return torch.nn.functional.pad(x, [0, 8 - x.shape[-1] % 8])


def _window(window_size) -> Tuple[int, int]:
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"window_size: expected a pair (left, right), got {window_size!r}") from None
    return int_arg(left, "window_size[0]"), int_arg(right, "window_size[1]")


def _kv_quant_args(kv_cache_dtype, k_scale, v_scale) -> tuple:
    """The quantised-cache arguments as the kernel ops take them (the kernel checks the rest)."""
    if not isinstance(kv_cache_dtype, str):
        raise TypeError(f"kv_cache_dtype: expected a str, got {type(kv_cache_dtype).__name__}")
    for t, name in ((k_scale, "k_scale"), (v_scale, "v_scale")):
        if t is not None:
            require_tensor(t, name)
    return kv_cache_dtype, k_scale, v_scale


# ---- flash_attn_varlen_func ------------------------------------------------------------------


@kernel_op("flash_attn_varlen_func", mutates_args=("out",))
def _varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
    causal: bool, window_left: int, window_right: int, softcap: float,
    alibi_slopes: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
    out: Optional[torch.Tensor], return_lse: bool, kv_cache_dtype: str = "auto",
    k_scale: Optional[torch.Tensor] = None, v_scale: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    o = torch.empty_like(q) if out is None else out
    lse = torch.empty((q.shape[1], q.shape[0]) if return_lse else (0,), dtype=torch.float32, device=q.device)
    lib = lib_for(q)
    ensure_sm90_decided(q, lib)
    lib.flash_attn_varlen_fwd(
        dl(q), dl(k), dl(v), dl(cu_seqlens_q), dl(cu_seqlens_k), max_seqlen_q, max_seqlen_k,
        softmax_scale, causal, window_left, window_right, softcap, dl(alibi_slopes),
        dl(block_table), dl(o), dl(lse) if return_lse else None, kv_cache_dtype,
        dl(k_scale, "k_scale"), dl(v_scale, "v_scale"), stream_of(q),
    )
    # A custom op may not return its input: with out= the caller already holds the result.
    return (o if out is None else torch.empty(0, dtype=q.dtype, device=q.device)), lse


@_varlen.op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      window_left, window_right, softcap, alibi_slopes, block_table, out, return_lse,
      kv_cache_dtype="auto", k_scale=None, v_scale=None):
    o = torch.empty_like(q) if out is None else q.new_empty(0)
    lse = q.new_empty((q.shape[1], q.shape[0]) if return_lse else (0,), dtype=torch.float32)
    return o, lse


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Optional[torch.Tensor] = None,
    *,
    return_softmax_lse: bool = False,
    out: Optional[torch.Tensor] = None,
    kv_cache_dtype: str = "auto",
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
):
    """Attention over a ragged batch: ``q [total_q, Hq, D]``, sequence b owning rows
    ``cu_seqlens_q[b] : cu_seqlens_q[b+1]`` (flash-attn 2.8's signature).

    Dense: ``k``/``v`` are ``[total_k, Hkv, D]`` split by ``cu_seqlens_k``. Paged (``block_table
    [b, max_blocks]`` given): ``k``/``v`` are caches ``[num_blocks, block_size, Hkv, D]`` and
    ``cu_seqlens_k`` gives each sequence's cached length (the queries are its last rows: chunked
    prefill, prefix-cache hits). GQA/MQA when Hkv divides Hq. ``softmax_scale`` defaults to
    ``D ** -0.5``. ``alibi_slopes``: float32 ``[Hq]`` or ``[b, Hq]``. ``dropout_p`` must be 0;
    ``deterministic`` is accepted (the forward is deterministic).

    Returns ``out``; with ``return_attn_probs=True`` flash-attn's ``(out, softmax_lse, None)``
    (``S_dmask`` is None without dropout, as in flash-attn); with the keyword-only extension
    ``return_softmax_lse=True`` ``(out, softmax_lse)``. lse is float32 ``[Hq, total_q]``.
    ``out=`` (keyword-only): write the result there. ``kv_cache_dtype`` / ``k_scale`` /
    ``v_scale`` (keyword-only, paged only): vLLM's quantised caches, read as they are (see
    :func:`flash_attn_with_kvcache`)."""
    require_tensor(q, "q", 3, "[total_q, num_heads, head_dim]")
    require_tensor(k, "k")
    require_tensor(v, "v")
    for t, name in ((alibi_slopes, "alibi_slopes"), (out, "out")):
        if t is not None:
            require_tensor(t, name)
    _no_dropout(dropout_p)
    left, right = _window(window_size)
    want_lse = bool(return_softmax_lse) or bool(return_attn_probs)
    scale = _scale(softmax_scale, q)
    d = q.shape[-1]
    padded = d % 8 != 0
    o, lse = _varlen(
        _pad_to_8(q), _pad_to_8(k), _pad_to_8(v), _i32(cu_seqlens_q, "cu_seqlens_q"),
        _i32(cu_seqlens_k, "cu_seqlens_k"), int_arg(max_seqlen_q, "max_seqlen_q"),
        int_arg(max_seqlen_k, "max_seqlen_k"), scale, bool(causal), left, right,
        float_arg(softcap, "softcap"), alibi_slopes, _i32(block_table, "block_table", optional=True),
        None if padded else out, want_lse, *_kv_quant_args(kv_cache_dtype, k_scale, v_scale),
    )
    if padded:
        o = o[..., :d]
        if out is not None:
            out.copy_(o)
    if out is not None:
        o = out
    if return_attn_probs:
        return o, lse, None
    return (o, lse) if return_softmax_lse else o


# The registered custom op (torch.ops.llmkern.flash_attn_varlen_func) takes the normalised
# arguments of _varlen; the public function fills defaults and converts indices around it.
flash_attn_varlen_func.op = _varlen.op
set_default_attend(flash_attn_varlen_func)   # the prefill the sm_90a check compares on


# ---- flash_attn_with_kvcache -----------------------------------------------------------------


@kernel_op("flash_attn_with_kvcache", mutates_args=("k_cache", "v_cache", "out"))
def _kvcache(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
    v: Optional[torch.Tensor], rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor],
    cache_seqlens: torch.Tensor, cache_batch_idx: Optional[torch.Tensor],
    cache_leftpad: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
    softmax_scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
    rotary_interleaved: bool, alibi_slopes: Optional[torch.Tensor], num_splits: int,
    out: Optional[torch.Tensor], return_lse: bool, kv_cache_dtype: str = "auto",
    k_scale: Optional[torch.Tensor] = None, v_scale: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    o = torch.empty_like(q) if out is None else out
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]) if return_lse else (0,),
                      dtype=torch.float32, device=q.device)
    lib = lib_for(q)
    ensure_sm90_decided(q, lib)
    num_splits, workspace = split_workspace(lib, q, k_cache, block_table, num_splits)
    # Rotated queries go to a buffer the attention then reads (q itself is the caller's).
    q_rot = torch.empty(q.shape, dtype=q.dtype, device=q.device) if rotary_cos is not None else None
    lib.flash_attn_kvcache_fwd_ext(
        dl(q), dl(k_cache), dl(v_cache), dl(k), dl(v), dl(rotary_cos), dl(rotary_sin),
        dl(cache_seqlens), dl(cache_batch_idx), dl(cache_leftpad), dl(block_table),
        softmax_scale, causal, window_left, window_right, softcap, rotary_interleaved,
        dl(alibi_slopes), num_splits, dl(o), dl(lse) if return_lse else None, dl(workspace),
        dl(q_rot), kv_cache_dtype, dl(k_scale, "k_scale"), dl(v_scale, "v_scale"), stream_of(q),
    )
    return (o if out is None else torch.empty(0, dtype=q.dtype, device=q.device)), lse


@_kvcache.op.register_fake
def _(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
      cache_leftpad, block_table, softmax_scale, causal, window_left, window_right, softcap,
      rotary_interleaved, alibi_slopes, num_splits, out, return_lse, kv_cache_dtype="auto",
      k_scale=None, v_scale=None):
    o = torch.empty_like(q) if out is None else q.new_empty(0)
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]) if return_lse else (0,), dtype=torch.float32)
    return o, lse


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    rotary_cos: Optional[torch.Tensor] = None,
    rotary_sin: Optional[torch.Tensor] = None,
    cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Optional[torch.Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    out: Optional[torch.Tensor] = None,
    kv_cache_dtype: str = "auto",
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
):
    """Attention of ``q [b, s, Hq, D]`` against a KV cache: decode (s = 1) and multi-token append
    (s > 1, e.g. speculative verification). flash-attn 2.8's signature.

    Dense cache ``[b_cache, seqlen_cache, Hkv, D]`` or paged ``[num_blocks, block_size, Hkv, D]``
    with ``block_table [b, max_blocks]``. ``cache_seqlens`` (int or ``[b]``) are the cached lengths;
    None = the whole cache. When ``k``/``v [b, s_new, Hkv, D]`` are given they are written into the
    cache in place at ``cache_seqlens[b]`` onwards and attended to in the same call (keys
    ``cache_seqlens[b] + s_new``; ``cache_seqlens`` itself is not updated).

    ``rotary_cos``/``rotary_sin [seqlen_ro, rotary_dim / 2]`` (with k/v): the new keys are rotated
    at positions ``cache_seqlens[b] + i`` as they are written, and q at the same positions when
    causal or local, else all of q at ``cache_seqlens[b]``; ``rotary_interleaved`` pairs features
    (0, 1), (2, 3), ... else (i, i + rotary_dim / 2) (GPT-NeoX). ``cache_batch_idx [b]``: the cache
    batch each sequence uses (dense caches). ``cache_leftpad [b]``: each sequence's keys start at
    that cache row (dense caches). ``num_splits``: split-KV partitions per sequence (0 = auto).
    Returns ``out`` or ``(out, lse)`` with lse float32 ``[b, Hq, s]``. ``out=`` (keyword-only).

    Quantised caches (keyword-only, vLLM's names): ``kv_cache_dtype`` "fp8" / "fp8_e4m3" /
    "fp8_e5m2" (uint8 caches of fp8 codes) or "int8" (int8 caches), ``k_scale`` / ``v_scale``
    float32 per tensor (0-d or ``[1]``) or per kv head ``[Hkv]``. The kernels read the codes and
    dequantise in registers (value = code * scale); appended k/v are quantised as written
    (round to nearest even, saturating), as ``reshape_and_cache_flash`` does. "auto" (default):
    caches in q's dtype, scales ignored."""
    require_tensor(q, "q")
    require_tensor(k_cache, "k_cache")
    require_tensor(v_cache, "v_cache")
    for t, name in ((k, "k"), (v, "v"), (alibi_slopes, "alibi_slopes"), (out, "out"),
                    (rotary_cos, "rotary_cos"), (rotary_sin, "rotary_sin")):
        if t is not None:
            require_tensor(t, name)
    if (k is None) != (v is None):
        raise ValueError(f"{'v' if k is not None else 'k'}: k and v must be given together")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError(f"{'rotary_sin' if rotary_cos is not None else 'rotary_cos'}: "
                         "rotary_cos and rotary_sin must be given together")
    if q.dim() != 4:
        raise ValueError(f"q: expected a 4-D tensor [batch, seqlen_q, num_heads, head_dim], got shape {tuple(q.shape)}")
    batch = q.shape[0]
    if cache_seqlens is None:
        if k is not None:
            raise ValueError("cache_seqlens: required when k/v are appended (where to write them)")
        if block_table is not None:
            if block_table.dim() != 2:
                raise ValueError(f"block_table: expected a 2-D tensor [batch, max_blocks], got shape {tuple(block_table.shape)}")
            full = block_table.shape[1] * (k_cache.shape[1] if k_cache.dim() == 4 else 0)
        else:
            full = k_cache.shape[1] if k_cache.dim() >= 2 else 0
        cache_seqlens = torch.full((batch,), full, dtype=torch.int32, device=q.device)
    elif not isinstance(cache_seqlens, torch.Tensor):
        cache_seqlens = torch.full((batch,), int_arg(cache_seqlens, "cache_seqlens", -(2**31), 2**31 - 1),
                                   dtype=torch.int32, device=q.device)
    num_splits = int_arg(num_splits, "num_splits")
    left, right = _window(window_size)
    scale = _scale(softmax_scale, q)
    d = q.shape[-1]
    if d % 8 != 0:
        return _kvcache_padded(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                               cache_batch_idx, cache_leftpad, block_table, scale, causal,
                               window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
                               return_softmax_lse, out, kv_cache_dtype, k_scale, v_scale)
    if q.dim() == 4 and q.shape[0] > 1 and q.shape[1] > 1 and q.stride(0) != q.shape[1] * q.stride(1):
        q = q.contiguous()  # the kernel views [b, s] as one row dim
    o, lse = _kvcache(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, _i32(cache_seqlens, "cache_seqlens"),
        _i32(cache_batch_idx, "cache_batch_idx", optional=True),
        _i32(cache_leftpad, "cache_leftpad", optional=True), _i32(block_table, "block_table", True),
        scale, bool(causal), left, right, float_arg(softcap, "softcap"), bool(rotary_interleaved),
        alibi_slopes, num_splits, out, bool(return_softmax_lse),
        *_kv_quant_args(kv_cache_dtype, k_scale, v_scale),
    )
    if out is not None:
        o = out
    return (o, lse) if return_softmax_lse else o


def _kvcache_padded(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                    cache_batch_idx, cache_leftpad, block_table, scale, causal, window_size,
                    softcap, rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse, out,
                    kv_cache_dtype="auto", k_scale=None, v_scale=None):
    """Head dims that are not a multiple of 8: the call on zero-padded copies (as flash-attn does,
    caches included), the appended rows copied back into the caller's caches."""
    d = q.shape[-1]
    kc, vc = _pad_to_8(k_cache), _pad_to_8(v_cache)
    res = flash_attn_with_kvcache(
        _pad_to_8(q), kc, vc, _pad_to_8(k), _pad_to_8(v), rotary_cos, rotary_sin, cache_seqlens,
        cache_batch_idx, cache_leftpad, block_table, scale, causal, window_size, softcap,
        rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse,
        kv_cache_dtype=kv_cache_dtype, k_scale=k_scale, v_scale=v_scale)
    o, lse = res if return_softmax_lse else (res, None)
    if k is not None:
        k_cache.copy_(kc[..., :d])
        v_cache.copy_(vc[..., :d])
    o = o[..., :d]
    if out is not None:
        out.copy_(o)
        o = out
    return (o, lse) if return_softmax_lse else o


flash_attn_with_kvcache.op = _kvcache.op


def decode_append_paged(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, rotary_cos: torch.Tensor, rotary_sin: torch.Tensor,
                        cache_seqlens: torch.Tensor, block_table: torch.Tensor, softmax_scale: float,
                        window_size: Tuple[int, int], out: torch.Tensor, kv_cache_dtype: str = "auto",
                        k_scale: Optional[torch.Tensor] = None,
                        v_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A runtime's decode step of one layer in one call: ``flash_attn_with_kvcache(q, k_cache,
    v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, block_table=block_table, causal=True,
    rotary_interleaved=False, out=out)`` (GPT-NeoX rotation of the new key and of q at
    ``cache_seqlens``, the key/value written into the paged cache, attention over it), without the
    public function's normalisation of its arguments, which costs more than the kernel at batch 1:
    the caller passes them in their final form (int32 indices, ``q``/``out [b, 1, Hq, D]``,
    ``k``/``v [b, 1, Hkv, D]``, D a multiple of 8). The kernel still checks every one.
    ``kv_cache_dtype`` / ``k_scale`` / ``v_scale``: a quantised cache, as flash_attn_with_kvcache."""
    lib = lib_for(q)
    q_rot = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lib.flash_attn_kvcache_fwd_ext(
        dl(q, "q"), dl(k_cache, "k_cache"), dl(v_cache, "v_cache"), dl(k, "k"), dl(v, "v"),
        dl(rotary_cos, "rotary_cos"), dl(rotary_sin, "rotary_sin"), dl(cache_seqlens, "cache_seqlens"),
        None, None, dl(block_table, "block_table"), float(softmax_scale), True, int(window_size[0]),
        int(window_size[1]), 0.0, False, None, 0, dl(out, "out"), None, None, dl(q_rot), kv_cache_dtype,
        dl(k_scale, "k_scale"), dl(v_scale, "v_scale"), stream_of(q))
    return out
