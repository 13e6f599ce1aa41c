"""Token embedding and LM head. A tied head whose weight is packed for the GEMM serves the
embedding lookups too (no second copy of the vocabulary matrix)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..ops.linear import linear_packed_into
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


# torch runs an elementwise op over fewer elements than its grain (32768) on the calling thread.
_SERIAL_CHUNK = 16384


def _to_float(x: torch.Tensor) -> torch.Tensor:
    """x as fp32. On CPU without a torch intra-op parallel region: one wakes torch's OpenMP
    threads, which then spin for milliseconds on the cores that the next kernels' threads need
    (measured: the bf16 -> fp32 copy of one row of logits was the only such region in a batch-1
    bf16 decode step)."""
    if x.dtype == torch.float32 or x.device.type != "cpu" or x.numel() <= _SERIAL_CHUNK:
        return x.float()
    out = torch.empty(x.shape, dtype=torch.float32)
    src, dst = x.reshape(-1), out.view(-1)
    for i in range(0, src.numel(), _SERIAL_CHUNK):
        dst[i:i + _SERIAL_CHUNK].copy_(src[i:i + _SERIAL_CHUNK])
    return out


def compute_logits(lm_head: Linear, hidden: torch.Tensor, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """LM head on the selected rows only (those that sample); fp32 logits [rows, vocab]."""
    if rows is not None:
        hidden = hidden.index_select(0, rows)
    if (isinstance(lm_head, Linear) and lm_head.packed and lm_head.weight.dtype == torch.bfloat16
            and hidden.dtype == torch.bfloat16 and hidden.device.type == "cpu"):
        # the GEMM writes the bf16 logits as fp32 (the same values): no widening pass, which was
        # ~0.8 ms of a 32-row decode step
        out = torch.empty((hidden.shape[0], lm_head.out_features), dtype=torch.float32)
        return linear_packed_into(hidden.contiguous(), lm_head.weight, lm_head.out_features, lm_head.bias, out)
    return _to_float(lm_head(hidden))
