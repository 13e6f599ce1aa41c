"""Argument normalisers shared by every op wrapper (python/llmkern/ops/*).

Each returns the value in the form the kernels take, or raises TypeError / ValueError whose message
starts with the argument's name: a wrong Python type never reaches pybind11 (whose error is a dump
of the C++ signature) or the allocator."""
from __future__ import annotations

import numbers
import operator
from typing import Optional

import torch

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def require_tensor(x, name: str, ndim: Optional[int] = None, layout: str = "") -> torch.Tensor:
    """`x` as a tensor on a supported device; with `ndim`, of that rank (`layout` names the dims)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    # is_meta is the cheap test on the hot path; other devices fail DLPack export, where dl()
    # raises the same error.
    if x.is_meta:
        raise_unsupported_device(x, name)
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor {layout}, got shape {tuple(x.shape)}".replace("  ", " "))
    return x


def raise_unsupported_device(x: torch.Tensor, name: str):
    raise ValueError(f"{name}: tensors on device '{x.device.type}' are not supported "
                     f"(expected a CPU or CUDA tensor)")


def optional_tensor(x, name: str) -> Optional[torch.Tensor]:
    return None if x is None else require_tensor(x, name)


def int_arg(x, name: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """An integer in [lo, hi]: Python ints, numpy integers and one-element integer tensors; bools
    and floats are rejected (even integral ones: they usually mean an argument slipped)."""
    if type(x) is int and lo <= x <= hi:  # the common case, first
        return x
    if isinstance(x, torch.SymInt):
        return x  # traced under torch.compile: checked when the kernel runs
    if isinstance(x, bool) or isinstance(x, float):
        raise TypeError(f"{name}: expected an int, got {type(x).__name__} {x!r}")
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(x).__name__}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{name}: must be in [{lo}, {hi}], got {v}")
    return v


def float_arg(x, name: str) -> float:
    """A real number as a Python float (NaN/inf pass: each op says which values it accepts)."""
    if type(x) is float:
        return x
    if isinstance(x, torch.SymFloat):
        return x
    if isinstance(x, bool) or not isinstance(x, (numbers.Real, torch.Tensor)):
        raise TypeError(f"{name}: expected a number, got {type(x).__name__} {x!r}")
    try:
        return float(x)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name}: expected a number, got {x!r}") from None
