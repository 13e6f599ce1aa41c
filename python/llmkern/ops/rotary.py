"""Rotary position embedding (vLLM's rotary_embedding signature) -> csrc/rotary/.

In place on the query and key rows, with the cos/sin of every position precomputed once
(``cos_sin_cache [max_position, rot_dim]``: cos in the first half, sin in the second, as vLLM
builds it). The math is done in fp32 and rounded once to the storage dtype."""
from __future__ import annotations

import math
from typing import Optional

import torch

from .._args import int_arg
from .._backend import dl, kernel_op, lib_for, require_tensor, stream_of

__all__ = ["rotary_embedding"]


def _heads(t: torch.Tensor, name: str, num_tokens: int, head_size: int) -> torch.Tensor:
    """vLLM's layouts ``[..., heads * head_size]`` or ``[..., heads, head_size]`` (leading dims =
    the tokens of ``positions``; any head stride, e.g. a slice of padded heads) -> a view
    ``[T, heads * head_size]`` or ``[T, heads, head_size]``; never a copy (the op is in place)."""
    require_tensor(t, name)
    try:
        if t.dim() >= 3 and t.shape[-1] == head_size and math.prod(t.shape[:-2]) == num_tokens:
            return t.view(num_tokens, t.shape[-2], head_size)
        if t.dim() >= 2 and math.prod(t.shape[:-1]) == num_tokens:
            return t.view(num_tokens, t.shape[-1])
    except RuntimeError:
        raise ValueError(f"{name}: the token dims of shape {tuple(t.shape)} (strides {t.stride()}) "
                         "cannot be viewed as one") from None
    return t  # the kernel's checks say what is wrong, by name


@kernel_op("rotary_embedding", mutates_args=("query", "key"))
def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor], head_size: int,
                     cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    """Rotates the first ``rot_dim`` features of every head of ``query`` (and ``key``, if given) by
    the angles of ``positions``: vLLM's layouts, ``positions [T]`` or ``[batch, seq]`` with
    ``query [..., heads * head_size]`` or ``[..., heads, head_size]`` (any head stride).
    ``is_neox``: pairs (i, i + rot_dim/2), Llama's rotate-half; otherwise (2i, 2i + 1), GPT-J's.
    ``key`` must be a separate tensor from ``query`` (views of one fused qkv that share no
    element are fine); an overlap raises ValueError."""
    require_tensor(positions, "positions")
    hs = int_arg(head_size, "head_size")
    n = positions.numel()
    q = _heads(query, "query", n, hs)
    k = None if key is None else _heads(key, "key", n, hs)
    require_tensor(cos_sin_cache, "cos_sin_cache")
    lib_for(q).rotary_embedding(dl(positions.reshape(-1)), dl(q), dl(k), hs, dl(cos_sin_cache),
                                bool(is_neox), stream_of(q))


@rotary_embedding.op.register_fake
def _(positions, query, key, head_size, cos_sin_cache, is_neox):
    return None
