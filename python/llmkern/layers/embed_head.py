"""Token embedding and LM head. A tied head whose weight is packed for the GEMM serves the
embedding lookups too (no second copy of the vocabulary matrix)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .linear import Linear


def embed_tokens(ids: torch.Tensor, embed: Optional[torch.Tensor], lm_head: Linear) -> torch.Tensor:
    """ids [T] -> [T, hidden]; embed None: the rows of the tied head."""
    return F.embedding(ids, embed) if embed is not None else lm_head.rows(ids)


def compute_logits(lm_head: Linear, hidden: torch.Tensor, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """LM head on the selected rows only (those that sample); fp32 logits [rows, vocab]."""
    if rows is not None:
        hidden = hidden.index_select(0, rows)
    return lm_head(hidden).float()
