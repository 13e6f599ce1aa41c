"""The gated SiLU of the MLP: silu(gate) * up over the fused [gate | up] projection."""
from __future__ import annotations

import torch

from ..ops.layernorm import silu_and_mul as _silu_and_mul
from ..ops.layernorm import silu_and_mul_rows


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2 * inter] -> [T, inter]."""
    out = torch.empty((gate_up.shape[0], gate_up.shape[-1] // 2), dtype=gate_up.dtype, device=gate_up.device)
    if gate_up.dim() == 2:
        silu_and_mul_rows(out, gate_up)
    else:
        _silu_and_mul(out, gate_up)
    return out
