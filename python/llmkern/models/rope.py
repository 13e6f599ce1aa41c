"""Rotary position embeddings: inverse frequencies (default, linear, llama3 scaling) and the
cos/sin cache that llmkern's rotary_embedding kernel reads (shared by all layers)."""
from __future__ import annotations

import math
from typing import Optional

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


def cos_sin_cache(head_dim: int, theta: float, scaling: Optional[dict], max_pos: int,
                  dtype: torch.dtype, device) -> torch.Tensor:
    """[max_pos, head_dim]: cos of every position's angles in the first half, sin in the second
    (vLLM's layout), in the model dtype (rounded from fp32, as HF)."""
    f = inv_freq(head_dim, theta, scaling)
    pos = torch.arange(max_pos, dtype=torch.float32)
    freqs = pos[:, None] * f[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype).to(device)
