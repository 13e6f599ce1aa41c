"""Argument checks shared by the sampling ops (rules in :mod:`llmkern.ops.sampling`): per-row
parameters, seed / offset, the NaN check and the filter order."""
from __future__ import annotations

import numbers
from typing import Optional, Union

import torch

Scalar = Union[torch.Tensor, float]
Seed = Optional[Union[int, torch.Tensor]]

_ORDERS = ("top_k_first", "joint")


def row_param(value, name: str, integral: bool = False):
    """(tensor or None, scalar) for a per-row parameter."""
    if isinstance(value, torch.Tensor):
        t = value.reshape(1) if value.dim() == 0 else value
        if integral:
            if t.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"{name}: expected an int32 or int64 tensor, got {t.dtype}")
        elif t.dtype != torch.float32:
            # integer thresholds (torch.full((B,), 1) for top_p) are converted, as FlashInfer does
            if t.dtype == torch.bool or t.is_complex():
                raise TypeError(f"{name}: expected a real-valued tensor, got {t.dtype}")
            t = t.float()
        return t.contiguous(), 0 if integral else 0.0
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number or a tensor, got {type(value).__name__}")
    if integral:
        if int(value) != value:
            raise ValueError(f"{name}: expected an integer, got {value}")
        return None, int(value)
    return None, float(value)


def _to_i64(v: int, name: str) -> int:
    if not -(2**63) <= v < 2**64:
        raise ValueError(f"{name}: expected a 64-bit integer, got {v}")
    return v - 2**64 if v >= 2**63 else v


def seed_offset(seed: Seed, offset: Seed, generator, device):
    """(seed_arr, seed_val, offset_arr, offset_val): explicit values, or two draws from the
    generator (a tensor, so no host synchronisation and CUDA-graph friendly)."""
    if seed is None or offset is None:
        dev = generator.device if generator is not None else device
        s = torch.randint(0, 2**62, (2,), dtype=torch.int64, generator=generator, device=dev)
        if s.device != device:
            s = s.to(device)
        return s[0:1], 0, s[1:2], 0
    out = []
    for v, name in ((seed, "seed"), (offset, "offset")):
        if isinstance(v, torch.Tensor):
            t = v.reshape(1) if v.dim() == 0 else v
            if t.dtype != torch.int64:
                raise TypeError(f"{name}: expected an int64 tensor, got {t.dtype}")
            out += [t.contiguous(), 0]
        elif isinstance(v, numbers.Integral) and not isinstance(v, bool):
            out += [None, _to_i64(int(v), name)]
        else:
            raise TypeError(f"{name}: expected an int or an int64 tensor, got {type(v).__name__}")
    return tuple(out)


def reject_nan(x: torch.Tensor, name: str, logits: bool) -> None:
    bad = torch.isnan(x).any() | (torch.isposinf(x).any() if logits else torch.isinf(x).any())
    if bool(bad):
        what = "NaN or +inf" if logits else "NaN or inf"
        raise ValueError(f"{name}: contains {what} (check_nan=True)")


def filter_order(filter_apply_order) -> str:
    if filter_apply_order not in _ORDERS:
        raise ValueError(f"filter_apply_order: expected 'top_k_first' or 'joint', got {filter_apply_order!r}")
    return filter_apply_order
