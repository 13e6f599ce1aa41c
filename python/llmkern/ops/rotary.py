"""Rotary position embedding (vLLM's rotary_embedding signature) -> csrc/rotary/.

In place on the query and key rows, with the cos/sin of every position precomputed once
(``cos_sin_cache [max_position, rot_dim]``: cos in the first half, sin in the second, as vLLM
builds it). The math is done in fp32 and rounded once to the storage dtype."""
from __future__ import annotations

from typing import Optional

import torch

from .._args import int_arg
from .._backend import dl, kernel_op, lib_for, require_tensor, stream_of

__all__ = ["rotary_embedding"]


def _heads(t: torch.Tensor, name: str) -> torch.Tensor:
    """[T, heads * head_size] or [T, heads, head_size] -> a [T, heads * head_size] view."""
    require_tensor(t, name)
    if t.dim() == 3:
        try:
            return t.view(t.shape[0], -1)
        except RuntimeError:
            raise ValueError(f"{name}: the heads of a token must be contiguous (shape {tuple(t.shape)}, "
                             f"strides {t.stride()})") from None
    return t


@kernel_op("rotary_embedding", mutates_args=("query", "key"))
def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor], head_size: int,
                     cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    """Rotates the first ``rot_dim`` features of every head of ``query [T, heads * head_size]``
    (and ``key``, if given) by the angles of ``positions [T]``. ``is_neox``: pairs (i, i + rot_dim/2),
    Llama's rotate-half; otherwise (2i, 2i + 1), GPT-J's. ``key`` must be a separate tensor from
    ``query`` (views of one fused qkv that share no element are fine); an overlap raises ValueError."""
    require_tensor(positions, "positions")
    q = _heads(query, "query")
    k = None if key is None else _heads(key, "key")
    require_tensor(cos_sin_cache, "cos_sin_cache")
    lib_for(q).rotary_embedding(dl(positions.reshape(-1)), dl(q), dl(k), int_arg(head_size, "head_size"),
                                dl(cos_sin_cache), bool(is_neox), stream_of(q))


@rotary_embedding.op.register_fake
def _(positions, query, key, head_size, cos_sin_cache, is_neox):
    return None
