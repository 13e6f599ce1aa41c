"""Linear projections, each weight stored in the layout of the kernel that runs it."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..ops.linear import linear_packed, linear_small_m, pack_linear_weight, packed_weight_rows

GEMV_ROWS = 8


class Linear:
    """One projection (fused ones too: Q/K/V, gate/up are single weights).

    CPU fp32: packed once into 16-feature panels for llmkern's register-tiled GEMM (linear_packed),
    ~2x torch's sgemm at the 8-64 rows of batched decode and ~1.5x at prefill sizes. Other CPU
    dtypes: llmkern's GEMV up to GEMV_ROWS rows (it streams the weights at the read bandwidth),
    torch beyond. CUDA: torch (cuBLAS)."""

    __slots__ = ("weight", "bias", "out_features", "packed")

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
        self.out_features = weight.shape[0]
        self.packed = weight.device.type == "cpu" and weight.dtype == torch.float32
        self.weight = pack_linear_weight(weight) if self.packed else weight
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return linear_packed(x, self.weight, self.out_features, self.bias)
        if x.shape[0] <= GEMV_ROWS and not x.is_cuda and x.stride(-1) == 1:
            return linear_small_m(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Weight rows `ids` [T] -> [T, in_features] (an embedding lookup of a tied LM head)."""
        if self.packed:
            return packed_weight_rows(self.weight, self.out_features, ids)
        return F.embedding(ids, self.weight)
