"""Padding helpers of flash-attn's ``flash_attn.bert_padding`` (the same names and returns), in
plain torch: between a padded batch ``[batch, seqlen, ...]`` with a mask and the packed rows
``[total, ...]`` + ``cu_seqlens`` that the varlen functions take. Forward only."""
from __future__ import annotations

from typing import Optional, Tuple

import torch


def index_first_axis(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Rows ``x[indices]`` of the first axis."""
    return x.index_select(0, indices)


def index_put_first_axis(values: torch.Tensor, indices: torch.Tensor, first_axis_dim: int) -> torch.Tensor:
    """A zero tensor ``[first_axis_dim, ...]`` with ``values`` at rows ``indices``."""
    out = values.new_zeros((first_axis_dim, *values.shape[1:]))
    out.index_copy_(0, indices, values)
    return out


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor,
                unused_mask: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """``hidden_states [batch, seqlen, ...]`` and ``attention_mask [batch, seqlen]`` (nonzero =
    token) -> ``(rows [total, ...], indices [total], cu_seqlens int32 [batch + 1], max_seqlen,
    used_seqlens int32 [batch])``. ``unused_mask`` marks rows kept but not counted as used."""
    keep = attention_mask.bool()
    if unused_mask is not None:
        keep = keep | unused_mask.bool()
    seqlens = keep.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.bool().sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(keep.flatten()).flatten()
    cu_seqlens = torch.zeros(seqlens.numel() + 1, dtype=torch.int32, device=seqlens.device)
    torch.cumsum(seqlens, dim=0, out=cu_seqlens[1:])
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    rows = index_first_axis(hidden_states.reshape(-1, *hidden_states.shape[2:]), indices)
    return rows, indices, cu_seqlens, max_seqlen, used


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Inverse of unpad_input: rows ``[total, ...]`` back to ``[batch, seqlen, ...]``, zeros
    where the mask was 0."""
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
