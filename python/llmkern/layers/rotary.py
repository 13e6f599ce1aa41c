"""Rotary position embeddings: inverse frequencies (default, linear, llama3 scaling), the cos/sin
cache that llmkern's rotary_embedding kernel reads, and the layer applying it (one cache shared by
all decoder layers)."""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..ops.rotary import rotary_embedding


def inv_freq(head_dim: int, theta: float, scaling: Optional[dict]) -> torch.Tensor:
    """float32 [head_dim // 2], computed exactly as transformers does (so greedy outputs match)."""
    f = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return f
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return f / scaling["factor"]
    if kind == "llama3":
        factor = scaling["factor"]
        lo, hi = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        lo_wavelen, hi_wavelen = old_len / lo, old_len / hi
        wavelen = 2 * math.pi / f
        scaled = torch.where(wavelen > lo_wavelen, f / factor, f)
        smooth = (old_len / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < hi_wavelen) & ~(wavelen > lo_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise NotImplementedError(f"rope_scaling: rope_type {kind!r} is not supported (default, linear, llama3)")


def cos_sin_cache(head_dim: int, theta: float, scaling: Optional[dict], max_pos: int,
                  dtype: torch.dtype, device) -> torch.Tensor:
    """[max_pos, head_dim]: cos of every position's angles in the first half, sin in the second
    (vLLM's layout), in the model dtype (rounded from fp32, as HF)."""
    f = inv_freq(head_dim, theta, scaling)
    pos = torch.arange(max_pos, dtype=torch.float32)
    freqs = pos[:, None] * f[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype).to(device)


class RotaryEmbedding:
    """NeoX-style rotation of the query and key rows in place, over the whole head."""

    def __init__(self, head_dim: int, theta: float, scaling: Optional[dict], max_pos: int,
                 dtype: torch.dtype, device):
        self.head_dim = head_dim
        self.cos_sin = cos_sin_cache(head_dim, theta, scaling, max_pos, dtype, device)
        # The same table as flash-attn's rotary_cos / rotary_sin [max_pos, head_dim / 2] (views),
        # for the decode kernel that rotates the new keys as it writes them.
        self.cos, self.sin = self.cos_sin[:, :head_dim // 2], self.cos_sin[:, head_dim // 2:]

    def __call__(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
        rotary_embedding(positions, q, k, self.head_dim, self.cos_sin, True)
