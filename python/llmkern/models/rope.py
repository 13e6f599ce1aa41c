"""Rotary position embeddings: inverse frequencies (default, linear, llama3 scaling) and the
cos/sin table that the model indexes once per step (shared by all layers)."""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch


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


def cos_sin_table(head_dim: int, theta: float, scaling: Optional[dict], max_pos: int,
                  dtype: torch.dtype, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [max_pos, head_dim // 2] in the model dtype (rounded from fp32, as HF)."""
    f = inv_freq(head_dim, theta, scaling)
    pos = torch.arange(max_pos, dtype=torch.float32)
    freqs = pos[:, None] * f[None, :]
    return freqs.cos().to(dtype).to(device), freqs.sin().to(dtype).to(device)


def apply_rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x [T, heads, D] with cos/sin [T, 1, D/2]; returns a new contiguous tensor.

    out1 = x1*cos - x2*sin, out2 = x2*cos + x1*sin: four fused elementwise passes, one allocation."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    o1, o2 = out[..., :half], out[..., half:]
    torch.mul(x1, cos, out=o1)
    o1.addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=o2)
    o2.addcmul_(x1, sin)
    return out
