"""Softmax and the filter ops on whole rows (FlashInfer signatures) -> csrc/sampling/: the
probabilities the ``*_from_logits`` samplers draw from, and top-k / top-p renormalisation and
masking with exact thresholds found by pivot searches, no sorting. Tie and degenerate-row rules:
:mod:`llmkern.ops.sampling`."""
from __future__ import annotations

from typing import Optional, Union

import torch

from .._backend import dl, kernel_op, lib_for, require_tensor, stream_of
from ._sampling_args import Scalar, row_param

__all__ = ["softmax", "top_k_mask_logits", "top_p_renorm_probs", "top_k_renorm_probs"]


@kernel_op("softmax")
def _softmax(logits: torch.Tensor, temperature_arr: Optional[torch.Tensor], temperature_val: float,
             token_bitmask: Optional[torch.Tensor] = None) -> torch.Tensor:
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    lib_for(logits).softmax(dl(logits), dl(out), dl(temperature_arr), temperature_val, dl(token_bitmask),
                            stream_of(logits))
    return out


@_softmax.op.register_fake
def _(logits, temperature_arr, temperature_val, token_bitmask=None):
    return torch.empty(logits.shape, dtype=torch.float32, device=logits.device)


def softmax(
    logits: torch.Tensor,
    temperature: Optional[Scalar] = None,
    enable_pdl: Optional[bool] = None,
    *,
    token_bitmask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``softmax(logits / temperature)`` per row, as float32 ``(batch_size, vocab_size)``
    (FlashInfer signature). ``temperature``: a number or a ``(batch_size,)`` tensor (default 1);
    llmkern defines temperature 0 as the one-hot of the row's argmax (lowest index on ties). ``-inf``
    logits get probability 0; a row with no finite logit, or with a ``+inf`` logit, becomes all
    zeros (the degenerate rows of :mod:`llmkern.ops.sampling`). These are exactly the probabilities the
    ``*_from_logits`` samplers draw from. ``enable_pdl`` (a CUDA launch hint) is accepted and
    ignored. ``token_bitmask`` (keyword, llmkern extension): the softmax of the masked logits, as
    the samplers take it (:mod:`llmkern.ops.sampling`)."""
    require_tensor(logits, "logits")
    if token_bitmask is not None:
        require_tensor(token_bitmask, "token_bitmask")
    t_arr, t_val = row_param(1.0 if temperature is None else temperature, "temperature")
    return _softmax(logits, t_arr, t_val, token_bitmask)


softmax.op = _softmax.op


def _renorm_op(name: str, kind: str):
    @kernel_op(name)
    def impl(x: torch.Tensor, arr: Optional[torch.Tensor], val: float) -> torch.Tensor:
        out = torch.empty_like(x)
        lib_for(x).renorm(dl(x), dl(out), kind, dl(arr), val, stream_of(x))
        return out

    @impl.op.register_fake
    def _(x, arr, val):
        return torch.empty_like(x)

    return impl


_top_p_renorm = _renorm_op("top_p_renorm_probs", "top_p")
_top_k_renorm = _renorm_op("top_k_renorm_probs", "top_k")
_top_k_mask = _renorm_op("top_k_mask_logits", "mask_logits")


def top_p_renorm_probs(probs: torch.Tensor, top_p: Scalar, is_deterministic: bool = False) -> torch.Tensor:
    """Keep the top-p set (tie rule of :mod:`llmkern.ops.sampling`) and renormalise it to sum to 1;
    other entries become 0. Rows without positive finite mass become all zeros. Same dtype as
    ``probs``; always deterministic."""
    require_tensor(probs, "probs")
    arr, val = row_param(top_p, "top_p")
    return _top_p_renorm(probs, arr, val)


top_p_renorm_probs.op = _top_p_renorm.op


def top_k_renorm_probs(probs: torch.Tensor, top_k: Union[torch.Tensor, int], *, is_deterministic: bool = False) -> torch.Tensor:
    """Keep the top-k set (every token tied with the k-th largest included) and renormalise it;
    other entries become 0. ``top_k`` 0 or ``vocab_size`` keeps all."""
    require_tensor(probs, "probs")
    arr, val = row_param(top_k, "top_k", integral=True)
    return _top_k_renorm(probs, arr, float(val))


top_k_renorm_probs.op = _top_k_renorm.op
top_p_renorm_prob = top_p_renorm_probs  # FlashInfer's aliases
top_k_renorm_prob = top_k_renorm_probs


def top_k_mask_logits(logits: torch.Tensor, top_k: Union[torch.Tensor, int]) -> torch.Tensor:
    """Set every logit outside the top-k to ``-inf`` (ties with the k-th largest kept; NaN becomes
    ``-inf``). Same dtype as ``logits``."""
    require_tensor(logits, "logits")
    arr, val = row_param(top_k, "top_k", integral=True)
    return _top_k_mask(logits, arr, float(val))


top_k_mask_logits.op = _top_k_mask.op
