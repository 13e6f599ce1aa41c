"""Index tensors as the int32 the kernels read: int64 is narrowed after a check that every entry
fits (otherwise 2**32 + 1 would silently become 1), other dtypes are a TypeError."""
from __future__ import annotations

import torch

from .._backend import dl, lib_for, require_tensor


def as_int32_index(t: torch.Tensor, name: str) -> torch.Tensor:
    require_tensor(t, name)
    if t.dtype == torch.int64:
        if not torch.compiler.is_compiling():  # traced: the check runs in the eager call only
            t = t.contiguous()
            lib_for(t).check_fits_int32(dl(t, name), name)
        return t.to(torch.int32)
    if t.dtype != torch.int32:
        raise TypeError(f"{name}: expected an int32 or int64 tensor, got {t.dtype}")
    return t
