"""linear_small_m -> csrc/linear/: y = x W^T + b for a few rows of x (decode steps).

A decode step's matmuls are matrix-vector products bound by reading the weights once; the CPU
kernel streams each weight row once for all rows of x. CUDA tensors go to torch (cuBLAS), which is
already bandwidth-bound there."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .._backend import dl, kernel_op, lib_for, require_tensor, stream_of

__all__ = ["linear_small_m"]

MAX_ROWS = 16


@kernel_op("linear_small_m")
def linear_small_m(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``torch.nn.functional.linear(x, weight, bias)`` for ``x [rows <= 16, in_features]``.

    fp32 / fp16 / bf16 with fp32 accumulation; weight rows must be contiguous."""
    require_tensor(x, "x")
    require_tensor(weight, "weight")
    if x.is_cuda:
        return F.linear(x, weight, bias)
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor [rows, in_features], got shape {tuple(x.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"weight: expected a 2-D tensor [out_features, in_features], got shape {tuple(weight.shape)}")
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    lib_for(x).linear_small_m(dl(x), dl(weight), dl(bias), dl(out), stream_of(x))
    return out


@linear_small_m.op.register_fake
def _(x, weight, bias=None):
    return x.new_empty(x.shape[0], weight.shape[0])
