"""flash-attn 2.8's ``flash_attn.ops.triton.layer_norm`` RMS norm: ``rms_norm_fn`` and ``RMSNorm``
(forward only) on llmkern's kernels. The fused residual add (``residual``, ``prenorm``,
``residual_in_fp32``) and ``bias`` are honoured; dropout, a second input (``x1``/``weight1``),
``rowscale`` and ``zero_centered_weight`` are not (NotImplementedError)."""
from __future__ import annotations

from typing import Optional

import torch

from ....._args import float_arg, require_tensor
from .....ops.layernorm import rms_norm as _rms_norm

__all__ = ["rms_norm_fn", "RMSNorm"]


def rms_norm_fn(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], residual=None, x1=None,
                weight1=None, bias1=None, eps: float = 1e-6, dropout_p: float = 0.0, rowscale=None,
                prenorm: bool = False, residual_in_fp32: bool = False, zero_centered_weight: bool = False,
                return_dropout_mask: bool = False, out_dtype=None, out: Optional[torch.Tensor] = None,
                residual_out: Optional[torch.Tensor] = None):
    """``y = rms_norm(x + residual) * weight + bias``. Returns ``y``, or ``(y, x + residual)`` with
    ``prenorm`` (the sum kept in fp32 with ``residual_in_fp32``, else in x's dtype)."""
    require_tensor(x, "x")
    require_tensor(weight, "weight")
    for name, v in (("x1", x1), ("weight1", weight1), ("bias1", bias1), ("rowscale", rowscale),
                    ("zero_centered_weight", zero_centered_weight), ("return_dropout_mask", return_dropout_mask)):
        if v is not None and v is not False:
            raise NotImplementedError(f"{name}: not supported by llmkern's rms_norm_fn")
    if float_arg(dropout_p, "dropout_p") != 0.0:
        raise NotImplementedError("dropout_p: llmkern is inference-only; dropout_p must be 0.0")
    summed = x if residual is None else x.float() + residual.float()
    res = summed.to(torch.float32 if residual_in_fp32 else x.dtype) if (prenorm or residual_out is not None) else None
    rows = summed.to(x.dtype).reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(rows)
    _rms_norm(y, rows, weight.to(x.dtype), float_arg(eps, "eps"))
    y = y.reshape(x.shape)
    if bias is not None:
        y = y + bias.to(y.dtype)
    if out_dtype is not None:
        y = y.to(out_dtype)
    if out is not None:
        out.copy_(y)
        y = out
    if residual_out is not None:
        residual_out.copy_(res)
        res = residual_out
    return (y, res) if prenorm else y


class RMSNorm(torch.nn.Module):
    """flash-attn's ``RMSNorm(hidden_size, eps=1e-5, dropout_p=0.0, zero_centered_weight=False,
    device=None, dtype=None)``; ``forward(x, residual=None, prenorm=False, residual_in_fp32=False)``."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, dropout_p: float = 0.0,
                 zero_centered_weight: bool = False, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.dropout_p = dropout_p
        self.zero_centered_weight = zero_centered_weight
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)

    def forward(self, x, residual=None, prenorm=False, residual_in_fp32=False):
        return rms_norm_fn(x, self.weight, self.bias, residual=residual, eps=self.eps, dropout_p=self.dropout_p,
                           prenorm=prenorm, residual_in_fp32=residual_in_fp32,
                           zero_centered_weight=self.zero_centered_weight)
