"""The sampling ops: one token per row from probabilities or logits, with top-k / top-p / min-p
filters (FlashInfer signatures) -> csrc/sampling/sampling{.cpp,_cpu.cpp,.cu}. Rows, parameters,
filter and tie rules, randomness, NaN handling and the ``token_bitmask`` keyword every sampler
takes: :mod:`llmkern.ops.sampling`."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from .._backend import dl, kernel_op, lib_for, require_tensor, stream_of
from ._sampling_args import Scalar, Seed, filter_order, reject_nan, row_param, seed_offset

__all__ = [
    "sampling_from_probs",
    "sampling_from_logits",
    "top_k_sampling_from_probs",
    "top_p_sampling_from_probs",
    "min_p_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
]


# Registered kernel ops (flat schemas: tensors and scalars only), one per public sampler.
def _sampler_op(name: str):
    @kernel_op(name)
    def impl(
        x: torch.Tensor,
        is_logits: bool,
        indices: Optional[torch.Tensor],
        temperature_arr: Optional[torch.Tensor],
        temperature_val: float,
        top_k_arr: Optional[torch.Tensor],
        top_k_val: int,
        top_p_arr: Optional[torch.Tensor],
        top_p_val: float,
        min_p_arr: Optional[torch.Tensor],
        min_p_val: float,
        filter_apply_order: str,
        seed_arr: Optional[torch.Tensor],
        seed_val: int,
        offset_arr: Optional[torch.Tensor],
        offset_val: int,
        token_bitmask: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        batch = indices.size(0) if indices is not None else x.size(0)
        out = torch.empty(batch, dtype=indices.dtype if indices is not None else torch.int32, device=x.device)
        valid = torch.empty(batch, dtype=torch.bool, device=x.device)
        lib_for(x).sample(
            dl(x), is_logits, dl(indices), dl(temperature_arr), temperature_val, dl(top_k_arr), top_k_val,
            dl(top_p_arr), top_p_val, dl(min_p_arr), min_p_val, filter_apply_order, dl(seed_arr), seed_val,
            dl(offset_arr), offset_val, dl(token_bitmask), dl(out), dl(valid), stream_of(x),
        )
        return out, valid

    @impl.op.register_fake
    def _(x, is_logits, indices, *args):
        batch = indices.size(0) if indices is not None else x.size(0)
        dtype = indices.dtype if indices is not None else torch.int32
        return x.new_empty(batch, dtype=dtype), x.new_empty(batch, dtype=torch.bool)

    return impl


_ops = {n: _sampler_op(n) for n in __all__}


def _sample(opname, x, is_logits, indices, temperature, top_k, top_p, min_p, order, deterministic,
            generator, check_nan, seed, offset, return_valid, token_bitmask=None):
    name = "logits" if is_logits else "probs"
    require_tensor(x, name)
    if indices is not None:
        require_tensor(indices, "indices")
    if token_bitmask is not None:
        require_tensor(token_bitmask, "token_bitmask")
    if check_nan:
        reject_nan(x, name, is_logits)
    t_arr, t_val = row_param(1.0 if temperature is None else temperature, "temperature")
    k_arr, k_val = row_param(top_k, "top_k", integral=True)
    p_arr, p_val = row_param(top_p, "top_p")
    m_arr, m_val = row_param(min_p, "min_p")
    s_arr, s_val, o_arr, o_val = seed_offset(seed, offset, generator, x.device)
    samples, valid = _ops[opname](x, is_logits, indices, t_arr, t_val, k_arr, k_val, p_arr, p_val, m_arr,
                                  m_val, filter_order(order), s_arr, s_val, o_arr, o_val, token_bitmask)
    return (samples, valid) if return_valid else samples


def _public(opname):
    def deco(fn):
        fn.op = _ops[opname].op
        return fn

    return deco


@_public("sampling_from_probs")
def sampling_from_probs(
    probs: torch.Tensor,
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    return_valid: bool = False,
    *,
    token_bitmask: Optional[torch.Tensor] = None,
):
    """Sample one token per row from ``probs`` (weights; see :mod:`llmkern.ops.sampling` for the row,
    randomness and NaN rules). Returns ``samples`` ``(batch_size,)``, or ``(samples, valid)`` with
    ``return_valid=True``. ``deterministic`` is accepted for compatibility: every path is
    deterministic."""
    return _sample("sampling_from_probs", probs, False, indices, None, 0, 1.0, 0.0, "joint", deterministic,
                   generator, check_nan, seed, offset, return_valid,
                   token_bitmask)


@_public("sampling_from_logits")
def sampling_from_logits(
    logits: torch.Tensor,
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    *,
    temperature: Optional[Scalar] = None,
    return_valid: bool = False,
    token_bitmask: Optional[torch.Tensor] = None,
):
    """Sample from ``softmax(logits / temperature)`` without materialising the probabilities.
    The draw is the one :func:`sampling_from_probs` makes from :func:`softmax`'s output with the
    same seed (the kernel computes those very probabilities).

    llmkern extensions (keyword-only): ``temperature`` (default 1) is a number or a
    ``(batch_size,)`` tensor, 0 meaning greedy for that row (argmax, lowest index on ties);
    ``return_valid``."""
    return _sample("sampling_from_logits", logits, True, indices, temperature, 0, 1.0, 0.0, "joint",
                   deterministic, generator, check_nan, seed, offset, return_valid,
                   token_bitmask)


@_public("top_k_sampling_from_probs")
def top_k_sampling_from_probs(
    probs: torch.Tensor,
    top_k: Union[torch.Tensor, int],
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    return_valid: bool = False,
    *,
    token_bitmask: Optional[torch.Tensor] = None,
):
    """Top-k sampling: draw from the renormalised weights of the tokens with fewer than ``top_k``
    strictly larger weights (ties at the boundary are all kept). ``top_k`` 0 or ``vocab_size``
    keeps every token."""
    return _sample("top_k_sampling_from_probs", probs, False, indices, None, top_k, 1.0, 0.0, "joint",
                   deterministic, generator, check_nan, seed, offset, return_valid,
                   token_bitmask)


@_public("top_p_sampling_from_probs")
def top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_p: Scalar,
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    return_valid: bool = False,
    *,
    token_bitmask: Optional[torch.Tensor] = None,
):
    """Top-p (nucleus) sampling: draw from the tokens whose strictly-greater mass is below
    ``top_p`` times the row's mass (the smallest high-probability set reaching ``top_p``, plus every
    token tied with its last member)."""
    return _sample("top_p_sampling_from_probs", probs, False, indices, None, 0, top_p, 0.0, "joint",
                   deterministic, generator, check_nan, seed, offset, return_valid,
                   token_bitmask)


@_public("min_p_sampling_from_probs")
def min_p_sampling_from_probs(
    probs: torch.Tensor,
    min_p: Scalar,
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    return_valid: bool = False,
    *,
    token_bitmask: Optional[torch.Tensor] = None,
):
    """Min-p sampling: draw from the tokens with ``w >= min_p * max(w)``."""
    return _sample("min_p_sampling_from_probs", probs, False, indices, None, 0, 1.0, min_p, "joint",
                   deterministic, generator, check_nan, seed, offset, return_valid,
                   token_bitmask)


@_public("top_k_top_p_sampling_from_logits")
def top_k_top_p_sampling_from_logits(
    logits: torch.Tensor,
    top_k: Union[torch.Tensor, int],
    top_p: Scalar,
    indices: Optional[torch.Tensor] = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    *,
    temperature: Optional[Scalar] = None,
    return_valid: bool = False,
    token_bitmask: Optional[torch.Tensor] = None,
):
    """Top-k and top-p sampling from ``softmax(logits / temperature)``, fused (one kernel, the
    probabilities are never written out).

    ``filter_apply_order="top_k_first"``: top-p applies to the top-k set renormalised;
    ``"joint"``: a token must pass both filters on the full distribution. The kernel samples from
    the probabilities :func:`softmax` computes, so for the same seed it draws the token
    :func:`top_k_top_p_sampling_from_probs` draws from ``softmax(logits)`` (exactly; on CPU rows
    taking the one-pass small-k path of ``top_k_first`` up to rare rounding of sums).
    llmkern extensions (keyword-only): ``temperature`` (default 1; 0 = greedy) is a number or a
    ``(batch_size,)`` tensor; ``return_valid``."""
    return _sample("top_k_top_p_sampling_from_logits", logits, True, indices, temperature, top_k, top_p, 0.0,
                   filter_apply_order, deterministic, generator, check_nan, seed, offset, return_valid,
                   token_bitmask)


@_public("top_k_top_p_sampling_from_probs")
def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_k: Union[torch.Tensor, int],
    top_p: Scalar,
    indices: Optional[torch.Tensor] = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    return_valid: bool = False,
    *,
    token_bitmask: Optional[torch.Tensor] = None,
):
    """Top-k and top-p sampling from probabilities (filter orders as in
    :func:`top_k_top_p_sampling_from_logits`)."""
    return _sample("top_k_top_p_sampling_from_probs", probs, False, indices, None, top_k, top_p, 0.0,
                   filter_apply_order, deterministic, generator, check_nan, seed, offset, return_valid,
                   token_bitmask)
