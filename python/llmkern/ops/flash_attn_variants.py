"""flash-attn 2.8's batched and packed attention entry points, on llmkern's two attention kernels.

``flash_attn_func`` (q/k/v ``[b, s, H, D]``) is a dense KV cache that is read whole, so it runs
the ``flash_attn_with_kvcache`` kernel with ``cache_seqlens = seqlen_k`` (same bottom-right
causal alignment, lse already ``[b, H, s]``); the packed variants pass views of the packed tensor
(no copy: the kernels take strided rows). Signatures, defaults and returns are flash-attn's:
``return_attn_probs=True`` gives ``(out, softmax_lse, None)`` (``S_dmask`` is None without
dropout, as in flash-attn); ``dropout_p`` must be 0; ``deterministic`` is accepted (the forward
is deterministic). ``out=`` is llmkern's keyword-only extension.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .._backend import require_tensor
from .attention import _no_dropout, _scale, flash_attn_varlen_func, flash_attn_with_kvcache

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
]


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    out: Optional[torch.Tensor] = None,
):
    """Attention of ``q [b, seqlen_q, Hq, D]`` over ``k``/``v [b, seqlen_k, Hkv, D]`` (GQA/MQA when
    Hkv divides Hq). Returns ``out [b, seqlen_q, Hq, D]``, or ``(out, lse [b, Hq, seqlen_q], None)``
    with ``return_attn_probs=True``."""
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        require_tensor(t, name)
        if t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D tensor [batch, seqlen, num_heads, head_dim], "
                             f"got shape {tuple(t.shape)}")
    _no_dropout(dropout_p)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k: dim 0 (batch) must be {q.shape[0]} (from q), got {k.shape[0]}")
    # softmax_scale from the caller's head dim, before any padding.
    res = flash_attn_with_kvcache(
        q, k, v, cache_seqlens=int(k.shape[1]), softmax_scale=_scale(softmax_scale, q),
        causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
        return_softmax_lse=bool(return_attn_probs), out=out)
    return (res[0], res[1], None) if return_attn_probs else res


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    out: Optional[torch.Tensor] = None,
):
    """``qkv [b, s, 3, H, D]``: flash_attn_func on its three views."""
    _check_packed(qkv, "qkv", 5, 3, "[batch, seqlen, 3, num_heads, head_dim]")
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale,
                           causal, window_size, softcap, alibi_slopes, deterministic,
                           return_attn_probs, out=out)


def flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    out: Optional[torch.Tensor] = None,
):
    """``q [b, seqlen_q, Hq, D]``, ``kv [b, seqlen_k, 2, Hkv, D]``: flash_attn_func on kv's views."""
    _check_packed(kv, "kv", 5, 2, "[batch, seqlen_k, 2, num_kv_heads, head_dim]")
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                           out=out)


def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    out: Optional[torch.Tensor] = None,
):
    """``qkv [total, 3, H, D]`` with one ``cu_seqlens`` for queries and keys."""
    _check_packed(qkv, "qkv", 4, 3, "[total, 3, num_heads, head_dim]")
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens,
                                  max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, out=out)


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
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
    *,
    out: Optional[torch.Tensor] = None,
):
    """``q [total_q, Hq, D]``, ``kv [total_k, 2, Hkv, D]``."""
    _check_packed(kv, "kv", 4, 2, "[total_k, 2, num_kv_heads, head_dim]")
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs, out=out)


def _check_packed(t, name: str, ndim: int, n: int, layout: str) -> None:
    require_tensor(t, name)
    if t.dim() != ndim or t.shape[-3] != n:
        raise ValueError(f"{name}: expected shape {layout}, got {tuple(t.shape)}")

