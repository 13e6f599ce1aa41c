"""flash-attn 2.8's ``flash_attn.ops.rms_norm``: ``rms_norm(x, weight, epsilon)`` and ``RMSNorm``,
forward only, on llmkern's RMS norm kernel (statistics in fp32)."""
from __future__ import annotations

import torch

from .triton.layer_norm import RMSNorm, rms_norm_fn

__all__ = ["rms_norm", "RMSNorm"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2, -1) + epsilon) * weight`` over the last dimension."""
    return rms_norm_fn(x, weight, None, eps=epsilon)
