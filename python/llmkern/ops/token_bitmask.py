"""Grammar masks on logits: xgrammar's ``apply_token_bitmask_inplace`` (same signature, same
semantics) -> csrc/sampling/token_bitmask{.cpp,_cpu.cpp,.cu}. The samplers take the same bitmask
through their ``token_bitmask`` keyword and apply it inside the draw instead (no pass of its own)."""
from __future__ import annotations

from typing import List, Optional, Union

import torch

from .._backend import dl, kernel_op, lib_for, require_tensor, stream_of

__all__ = ["apply_token_bitmask_inplace"]


@kernel_op("apply_token_bitmask_inplace", mutates_args=("logits",))
def _apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, indices: Optional[torch.Tensor],
                   vocab_size: int) -> None:
    lib_for(logits).apply_token_bitmask_inplace(dl(logits), dl(bitmask), dl(indices), vocab_size,
                                                stream_of(logits))


@_apply_bitmask.op.register_fake
def _(logits, *args):
    return None


def apply_token_bitmask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    *,
    vocab_size: Optional[int] = None,
    indices: Optional[Union[List[int], torch.Tensor]] = None,
) -> None:
    """Set ``logits[r, j] = -inf`` where bit ``j % 32`` of ``bitmask[r, j // 32]`` is 0, in place
    (xgrammar's function: ``logits`` ``(batch, V)`` or ``(V,)`` fp32/fp16/bf16, ``bitmask`` int32
    ``(batch, words)`` or ``(words,)`` on the same device).

    ``vocab_size``: only ``j < vocab_size`` is masked (default ``min(V, 32 * words)``: positions
    the bitmask does not cover are left as they are); it must not exceed ``V`` or ``32 * words``.
    ``indices``: the rows to mask (a list or an int tensor), each the same row of ``logits`` and
    ``bitmask``, whose batch sizes may then differ; without it they must match."""
    require_tensor(logits, "logits")
    require_tensor(bitmask, "bitmask")
    x = logits.unsqueeze(0) if logits.dim() == 1 else logits
    m = bitmask.unsqueeze(0) if bitmask.dim() == 1 else bitmask
    if indices is not None and not isinstance(indices, torch.Tensor):
        indices = torch.tensor(list(indices), dtype=torch.int64, device=logits.device)
    elif indices is not None:
        require_tensor(indices, "indices")
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 0):
        raise ValueError(f"vocab_size: expected an int >= 0 or None, got {vocab_size!r}")
    _apply_bitmask(x, m, indices, -1 if vocab_size is None else vocab_size)


apply_token_bitmask_inplace.op = _apply_bitmask.op
