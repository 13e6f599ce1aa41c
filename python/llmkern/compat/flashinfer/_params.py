"""FlashInfer's checks on per-row sampling parameters (``top_p``, ``top_k``, ``min_p``), in its
wording: a number, or a 1-D tensor with one value per output row. Its tests match these messages
by regex, and a port that catches them reads the same text; llmkern's own ops are laxer (a 0-d or
``(1,)`` tensor means one value for every row), so the compat entry points check first."""
from __future__ import annotations

import functools
import inspect

import torch

ROW_PARAMS = ("top_p", "top_k", "min_p")


def check_row_param(value, name: str, batch_size: int) -> None:
    if not isinstance(value, torch.Tensor):
        return
    if value.dim() == 0:
        raise ValueError(f"Expected a 1D tensor of shape (batch_size,) or scalar for {name}, got a "
                         "0-dimensional tensor")
    if value.dim() > 1:
        raise ValueError(f"Expected a 1D tensor or scalar for {name}, got a {value.dim()}D tensor")
    if value.shape[0] != batch_size:
        raise ValueError(f"Sampling parameter tensor batch size mismatch: {name} has {value.shape[0]} "
                         f"values, expected {batch_size} (one per output row)")


def flashinfer_row_params(fn):
    """``fn`` with FlashInfer's parameter checks in front: the batch is ``indices``' length when
    given (one output row per index), else the first input's rows."""
    sig = inspect.signature(fn)
    names = [n for n in ROW_PARAMS if n in sig.parameters]

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        bound = sig.bind_partial(*args, **kwargs).arguments
        first = next(iter(bound.values()), None)
        indices = bound.get("indices")
        if isinstance(indices, torch.Tensor):
            batch = indices.shape[0] if indices.dim() else 1
        elif isinstance(first, torch.Tensor) and first.dim() >= 1:
            batch = first.shape[0] if first.dim() > 1 else 1
        else:
            return fn(*args, **kwargs)  # the op reports the bad input itself
        for n in names:
            if n in bound:
                check_row_param(bound[n], n, batch)
        return fn(*args, **kwargs)

    return checked
