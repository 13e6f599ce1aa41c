"""RMSNorm over a flat batch of token rows, alone or fused with the residual add."""
from __future__ import annotations

import torch

from ..ops.layernorm import fused_add_rms_norm, fused_add_rms_norm_rows, rms_norm, rms_norm_rows


class RMSNorm:
    __slots__ = ("weight", "eps")

    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight = weight
        self.eps = eps

    def __call__(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out = norm(x); returns out."""
        if x.dim() == 2 and out.dim() == 2:  # the model's flat rows: the unchecked call
            rms_norm_rows(out, x, self.weight, self.eps)
        else:
            rms_norm(out, x, self.weight, self.eps)
        return out

    def add_(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """In place, one pass: residual += x, then x = norm(residual); returns x."""
        if x.dim() == 2 and residual.dim() == 2:
            fused_add_rms_norm_rows(x, residual, self.weight, self.eps)
        else:
            fused_add_rms_norm(x, residual, self.weight, self.eps)
        return x
