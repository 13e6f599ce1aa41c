"""Pooling of final hidden states into one vector per sequence (embeddings)."""
from __future__ import annotations

import numpy as np
import torch

POOLINGS = ("mean", "last", "cls")


def pool(hidden: torch.Tensor, cu: np.ndarray, how: str, normalize: bool) -> torch.Tensor:
    """hidden [T, H] of sequences laid end to end (cu: cumulative lengths) -> fp32 [n, H]:
    the mean of each sequence's rows, its last row or its first ("cls") row; L2-normalised if asked."""
    if how not in POOLINGS:
        raise ValueError(f"pooling: expected one of {', '.join(POOLINGS)}, got {how!r}")
    lens = torch.from_numpy(np.diff(cu)).to(hidden.device)
    if how == "mean":
        seg = torch.repeat_interleave(torch.arange(len(lens), device=hidden.device), lens)
        out = torch.zeros((len(lens), hidden.shape[1]), dtype=torch.float32, device=hidden.device)
        out.index_add_(0, seg, hidden.float())
        out /= lens.unsqueeze(1).to(out.dtype)
    else:
        rows = torch.from_numpy(cu[1:] - 1 if how == "last" else cu[:-1]).to(hidden.device)
        out = hidden.index_select(0, rows).float()
    return torch.nn.functional.normalize(out, dim=1) if normalize else out
