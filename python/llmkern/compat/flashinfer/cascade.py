"""``flashinfer.cascade``'s state merging (FlashInfer 0.6.x): combining attention outputs computed
over disjoint key sets from their base-2 lse, as cascade / split-KV / shared-prefix attention do.
Merged in fp32; ``v`` keeps the inputs' dtype, ``s`` is float32."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..._args import require_tensor

__all__ = ["merge_state", "merge_state_in_place", "merge_states"]


def _weights(s: torch.Tensor, dim: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(weights, merged lse) over `dim`: exp2(s - max), guarded where every state is empty (-inf)."""
    s = s.float()
    m = s.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    w = torch.exp2(s - m)
    total = w.sum(dim=dim, keepdim=True)
    return w / total.clamp(min=torch.finfo(torch.float32).tiny), (m + torch.log2(total)).squeeze(dim)


def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``v_* [seq, H, D]`` with lse ``s_* [seq, H]`` -> (``v [seq, H, D]``, ``s [seq, H]``)."""
    for t, name in ((v_a, "v_a"), (s_a, "s_a"), (v_b, "v_b"), (s_b, "s_b")):
        require_tensor(t, name)
    w, s = _weights(torch.stack([s_a, s_b], dim=1), 1)
    v = torch.stack([v_a, v_b], dim=1).float()
    return (v * w[..., None]).sum(dim=1).to(v_a.dtype), s


def merge_state_in_place(v: torch.Tensor, s: torch.Tensor, v_other: torch.Tensor, s_other: torch.Tensor,
                         mask: Optional[torch.Tensor] = None) -> None:
    """``(v, s) = merge_state(v, s, v_other, s_other)`` written into ``v`` / ``s``; rows where
    ``mask [seq]`` is False are left as they are."""
    v_new, s_new = merge_state(v, s, v_other, s_other)
    if mask is not None:
        keep = mask.bool()
        v_new = torch.where(keep[:, None, None], v_new, v)
        s_new = torch.where(keep[:, None], s_new, s.float())
    v.copy_(v_new)
    s.copy_(s_new)


def merge_states(v: torch.Tensor, s: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``v [seq, num_states, H, D]``, ``s [seq, num_states, H]`` -> merged ``([seq, H, D], [seq, H])``."""
    require_tensor(v, "v", 4, "[seq_len, num_states, num_heads, head_dim]")
    require_tensor(s, "s", 3, "[seq_len, num_states, num_heads]")
    w, merged = _weights(s, 1)
    return (v.float() * w[..., None]).sum(dim=1).to(v.dtype), merged
