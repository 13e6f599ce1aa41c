"""Token embedding and LM head. A tied head whose weight is packed for the GEMM serves the
embedding lookups too (no second copy of the vocabulary matrix)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .linear import Linear


def embed_tokens(ids: torch.Tensor, embed: Optional[torch.Tensor], lm_head: Linear, vocab_start: int = 0,
                 shard_size: Optional[int] = None) -> torch.Tensor:
    """ids [T] -> [T, hidden]; embed None: the rows of the tied head.

    Vocab-parallel shard (shard_size given): the table holds rows [vocab_start, vocab_start +
    shard_size); ids outside it give zero rows, so a sum over the shards is the full lookup."""
    if shard_size is None:
        return F.embedding(ids, embed) if embed is not None else lm_head.rows(ids)
    local = ids - vocab_start
    outside = (local < 0) | (local >= shard_size)
    local = local.masked_fill(outside, 0)
    rows = F.embedding(local, embed) if embed is not None else lm_head.rows(local)
    return rows.masked_fill_(outside.unsqueeze(1), 0)


def compute_logits(lm_head: Linear, hidden: torch.Tensor, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """LM head on the selected rows only (those that sample); fp32 logits [rows, vocab]."""
    if rows is not None:
        hidden = hidden.index_select(0, rows)
    return lm_head(hidden).float()
