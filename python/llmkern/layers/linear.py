"""Linear projections, each weight stored in the layout of the kernel that runs it."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..ops.linear import (linear_packed, linear_packed_silu_mul, linear_small_m_into, pack_gate_up_weight,
                          pack_gate_up_weight_bf16, pack_linear_weight, pack_linear_weight_bf16, packed_weight_rows)
from .activation import silu_and_mul

GEMV_ROWS = 8
_PACKERS = {torch.float32: (pack_linear_weight, pack_gate_up_weight),
            torch.bfloat16: (pack_linear_weight_bf16, pack_gate_up_weight_bf16)}


def _packs(w: torch.Tensor) -> bool:
    """CPU fp32 and bf16 weights run llmkern's packed GEMM (the layout for each: _PACKERS)."""
    return w.device.type == "cpu" and w.dtype in _PACKERS


class Linear:
    """One projection (fused ones too: Q/K/V, gate/up are single weights).

    CPU fp32 and bf16: packed once into 16-feature panels for llmkern's register-tiled GEMM
    (linear_packed; bf16 with k in pairs, AVX512_BF16 dot products where the CPU has them), at
    every row count: it reads W once per call on llmkern's thread pool, and measured faster than
    the GEMV from 1 row up. fp16 on CPU: llmkern's GEMV up to GEMV_ROWS rows (it streams the
    weights at the read bandwidth), torch beyond. CUDA: torch (cuBLAS)."""

    __slots__ = ("weight", "bias", "out_features", "in_features", "packed")

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
        self.out_features, self.in_features = weight.shape
        self.packed = _packs(weight)
        self.weight = _PACKERS[weight.dtype][0](weight) if self.packed else weight
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return linear_packed(x, self.weight, self.out_features, self.bias)
        if x.shape[0] <= GEMV_ROWS and not x.is_cuda and x.stride(-1) == 1 and x.dim() == 2:
            out = torch.empty((x.shape[0], self.out_features), dtype=x.dtype)
            return linear_small_m_into(x, self.weight, self.bias, out)
        return F.linear(x, self.weight, self.bias)

    def tensors(self):
        """The tensors this layer holds (weight, bias), for moves such as the huge-page one."""
        return [self.weight, self.bias]

    def set_tensors(self, ts) -> None:
        self.weight, self.bias = ts

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Weight rows `ids` [T] -> [T, in_features] (an embedding lookup of a tied LM head)."""
        if self.packed:
            return packed_weight_rows(self.weight, self.out_features, ids, self.in_features)
        return F.embedding(ids, self.weight)


class GateUpLinear(Linear):
    """The MLP's gate and up projections followed by the gated SiLU: x -> silu(x Wg^T) * (x Wu^T).

    CPU fp32 and bf16 without bias: one call, the packed GEMM with the gated SiLU as its epilogue
    (linear_packed_silu_mul on interleaved gate/up panels; the [T, 2 * inter] intermediate is never
    written). fp32: bit-identical to Linear([Wg; Wu]) + silu_and_mul when inter is a multiple of 16;
    bf16: rounded once, after the SiLU (the unfused pair rounds gate and up first).
    Elsewhere exactly that pair of calls. ``out_features`` is inter."""

    __slots__ = ("fused",)

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, bias: Optional[torch.Tensor] = None):
        self.fused = _packs(gate) and bias is None
        if not self.fused:
            super().__init__(torch.cat([gate, up]), bias)
            return
        self.out_features, self.in_features = gate.shape
        self.packed = True
        self.weight = _PACKERS[gate.dtype][1](gate, up)
        self.bias = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return linear_packed_silu_mul(x, self.weight, self.out_features)
        return silu_and_mul(super().__call__(x))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("GateUpLinear: no row lookup (it is no embedding)")
