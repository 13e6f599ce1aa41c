"""flash-attn 2.8's ``flash_attn.layers.rotary`` (forward only) on llmkern's rotary kernel:
``apply_rotary_emb`` (alias ``apply_rotary_emb_func``), ``apply_rotary_emb_qkv_``,
``apply_rotary_emb_kv_``. Same parameters and returns; the first ``rotary_dim = 2 *
cos.shape[-1]`` features of each head are rotated, computed in fp32 and rounded once (as
flash-attn's kernel does). ``interleaved=True`` pairs (2i, 2i + 1) (GPT-J), else (i, i + d/2)
(GPT-NeoX). No autograd: these are inference entry points."""
from __future__ import annotations

from typing import Optional, Union

import torch

from ...._args import require_tensor
from ....ops.rotary import rotary_embedding

__all__ = ["apply_rotary_emb", "apply_rotary_emb_func", "apply_rotary_emb_qkv_", "apply_rotary_emb_kv_"]


def _positions(x: torch.Tensor, seqlen_offsets, cu_seqlens: Optional[torch.Tensor]) -> torch.Tensor:
    """Every row's position: its index in its sequence plus that sequence's offset."""
    dev = x.device
    if cu_seqlens is None:
        b, s = x.shape[0], x.shape[1]
        pos = torch.arange(s, device=dev)[None, :].expand(b, s)
        off = seqlen_offsets if isinstance(seqlen_offsets, torch.Tensor) else torch.tensor(int(seqlen_offsets))
        return (pos + off.to(dev).reshape(-1, 1)).reshape(-1)
    cu = cu_seqlens.to(dev).long()
    lens = cu[1:] - cu[:-1]
    seq = torch.repeat_interleave(torch.arange(lens.numel(), device=dev), lens, output_size=x.shape[0])
    pos = torch.arange(x.shape[0], device=dev) - cu[:-1][seq]
    if isinstance(seqlen_offsets, torch.Tensor):
        return pos + seqlen_offsets.to(dev).long()[seq]
    return pos + int(seqlen_offsets)


def apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
                     inplace: bool = False, seqlen_offsets: Union[int, torch.Tensor] = 0,
                     cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None) -> torch.Tensor:
    """``x [batch, seqlen, nheads, headdim]`` (or ``[total, nheads, headdim]`` with ``cu_seqlens``),
    ``cos``/``sin [seqlen_ro, rotary_dim / 2]``; row i of a sequence sits at ``i + seqlen_offsets``
    (an int or ``[batch]``). Returns the rotated tensor (``x`` itself when ``inplace``)."""
    require_tensor(x, "x", 3 if cu_seqlens is not None else 4,
                   "[total, nheads, headdim]" if cu_seqlens is not None else "[batch, seqlen, nheads, headdim]")
    require_tensor(cos, "cos", 2, "[seqlen_ro, rotary_dim / 2]")
    require_tensor(sin, "sin", 2, "[seqlen_ro, rotary_dim / 2]")
    if 2 * cos.shape[-1] > x.shape[-1]:
        raise ValueError(f"cos: rotary_dim {2 * cos.shape[-1]} is more than headdim {x.shape[-1]}")
    out = x if inplace else x.clone()
    cache = torch.cat([cos, sin], dim=-1).to(x.dtype)
    rows = out.reshape(-1, out.shape[-2], out.shape[-1]) if cu_seqlens is None else out
    rotary_embedding(_positions(x, seqlen_offsets, cu_seqlens), rows, None, x.shape[-1], cache, not interleaved)
    if rows.data_ptr() != out.data_ptr():  # reshape copied (non-viewable x): write back
        out.copy_(rows.reshape(out.shape))
    return out


apply_rotary_emb_func = apply_rotary_emb  # flash-attn keeps the old name


def apply_rotary_emb_qkv_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          cos_k: Optional[torch.Tensor] = None, sin_k: Optional[torch.Tensor] = None,
                          interleaved: bool = False, seqlen_offsets: Union[int, torch.Tensor] = 0,
                          num_heads_q: Optional[int] = None) -> torch.Tensor:
    """In place on Q and K of ``qkv [b, s, 3, H, D]`` or ``[b, s, Hq + 2 * Hk, D]`` (then
    ``num_heads_q`` is required); ``cos_k``/``sin_k`` for K if they differ. Returns ``qkv``."""
    if qkv.dim() == 5:
        q, k = qkv[:, :, 0], qkv[:, :, 1]
    else:
        if num_heads_q is None:
            raise ValueError("num_heads_q: required when qkv is [batch, seqlen, Hq + 2 * Hk, headdim]")
        hk = (qkv.shape[2] - num_heads_q) // 2
        q, k = qkv[:, :, :num_heads_q], qkv[:, :, num_heads_q:num_heads_q + hk]
    for t, c, s in ((q, cos, sin), (k, cos if cos_k is None else cos_k, sin if sin_k is None else sin_k)):
        t.copy_(apply_rotary_emb(t, c, s, interleaved, False, seqlen_offsets))
    return qkv


def apply_rotary_emb_kv_(kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
                         seqlen_offsets: Union[int, torch.Tensor] = 0) -> torch.Tensor:
    """In place on K of ``kv [b, s, 2, H, D]``. Returns ``kv``."""
    k = kv[:, :, 0]
    k.copy_(apply_rotary_emb(k, cos, sin, interleaved, False, seqlen_offsets))
    return kv
