"""Repetition / frequency / presence penalties on logits (vLLM semantics) ->
csrc/sampling/penalties{.cpp,_cpu.cpp,.cu}."""
from __future__ import annotations

from typing import Optional

import torch

from .._backend import dl, kernel_op, lib_for, require_tensor, stream_of
from ._sampling_args import Scalar, row_param

__all__ = ["apply_penalties"]


@kernel_op("apply_penalties", mutates_args=("logits",))
def _apply_penalties(
    logits: torch.Tensor,
    output_token_counts: Optional[torch.Tensor],
    output_token_ids: Optional[torch.Tensor],
    prompt_mask: Optional[torch.Tensor],
    prompt_token_ids: Optional[torch.Tensor],
    rep_arr: Optional[torch.Tensor],
    rep_val: float,
    freq_arr: Optional[torch.Tensor],
    freq_val: float,
    pres_arr: Optional[torch.Tensor],
    pres_val: float,
) -> None:
    lib_for(logits).apply_penalties(
        dl(logits), dl(output_token_counts), dl(output_token_ids), dl(prompt_mask), dl(prompt_token_ids),
        dl(rep_arr), rep_val, dl(freq_arr), freq_val, dl(pres_arr), pres_val, stream_of(logits),
    )


@_apply_penalties.op.register_fake
def _(logits, *args):
    return None


def apply_penalties(
    logits: torch.Tensor,
    output_token_counts: Optional[torch.Tensor] = None,
    repetition_penalties: Scalar = 1.0,
    frequency_penalties: Scalar = 0.0,
    presence_penalties: Scalar = 0.0,
    prompt_mask: Optional[torch.Tensor] = None,
    output_token_ids: Optional[torch.Tensor] = None,
    prompt_token_ids: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Apply repetition / frequency / presence penalties to ``logits (b, V)`` in place (vLLM
    semantics) and return it.

    For tokens seen in the prompt or the output, the repetition penalty divides positive logits
    and multiplies the others; then ``logit -= frequency * count + presence * (count > 0)`` with
    ``count`` the token's occurrences in the output. The output side is given as dense
    ``output_token_counts (b, V)`` or as ``output_token_ids (b, L)``; the prompt side as
    ``prompt_mask (b, V)`` bool or ``prompt_token_ids (b, Lp)``. Token-id tensors are padded with
    ``-1`` or ``vocab_size`` (vLLM's padding). Penalties are numbers or ``(b,)`` tensors;
    ``repetition > 0``."""
    require_tensor(logits, "logits")
    for t, n in ((output_token_counts, "output_token_counts"), (prompt_mask, "prompt_mask"),
                 (output_token_ids, "output_token_ids"), (prompt_token_ids, "prompt_token_ids")):
        if t is not None:
            require_tensor(t, n)
    r_arr, r_val = row_param(repetition_penalties, "repetition_penalties")
    f_arr, f_val = row_param(frequency_penalties, "frequency_penalties")
    p_arr, p_val = row_param(presence_penalties, "presence_penalties")
    _apply_penalties(logits, output_token_counts, output_token_ids, prompt_mask, prompt_token_ids, r_arr, r_val,
                     f_arr, f_val, p_arr, p_val)
    return logits


apply_penalties.op = _apply_penalties.op
