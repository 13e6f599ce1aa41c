"""Whole KV blocks as bytes: a block's size over all layers, and gathering / scattering a set of
blocks to / from one flat byte tensor (what a prefill-decode hand-over sends)."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ..layers.kv_quant import cache_format


def kv_cache_geometry(caches) -> Tuple[int, str]:
    """(bytes of one block over all layers, K and V; dtype name, or a quantised cache's format) of a
    paged cache."""
    total = 0
    for k, v in caches:
        total += k[0].numel() * k.element_size() + v[0].numel() * v.element_size()
    dtype = str(caches[0][0].dtype).replace("torch.", "") if caches else "none"
    return total, cache_format(caches) or dtype  # quantised: its kind and scales, not "uint8"


def _runs(block_ids: List[int]) -> List[Tuple[int, int, int]]:
    """(position in block_ids, first block id, length) of each run of consecutive block ids."""
    runs: List[Tuple[int, int, int]] = []
    for i, b in enumerate(block_ids):
        if runs and runs[-1][1] + runs[-1][2] == b:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((i, b, 1))
    return runs


def _rows(cache: torch.Tensor) -> torch.Tensor:
    """A cache [blocks, ...] as bytes [blocks, block bytes] (a view: writes go to the cache)."""
    return cache.view(cache.shape[0], -1).view(torch.uint8)


def _parts(caches, n: int):
    """(cache rows, byte offset in the flat layout, bytes) of each K and V cache, layer-major."""
    off = 0
    for k, v in caches:
        for c in (k, v):
            size = n * c[0].numel() * c.element_size()
            yield _rows(c), off, size
            off += size


def gather_blocks(caches, block_ids: List[int], out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The blocks' KV over all layers as one flat byte tensor of len(block_ids) * block_bytes,
    layer-major (layer 0 K of every block, layer 0 V of every block, layer 1 K, ...). Copies
    go by runs of consecutive block ids (a sequence's blocks mostly are): plain slice copies,
    several times faster on a busy CPU than torch's index kernels. `out`: a uint8 tensor of
    that size to fill, else a new one."""
    n = len(block_ids)
    dev = caches[0][0].device if caches else torch.device("cpu")
    nbytes = n * kv_cache_geometry(caches)[0]
    if out is None:
        out = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    elif out.dtype != torch.uint8 or out.numel() != nbytes:
        raise ValueError(f"out: expected {nbytes} uint8 elements, got {out.numel()} {out.dtype}")
    runs = _runs(block_ids)
    for rows, off, size in _parts(caches, n):
        dst = out[off:off + size].view(n, -1)
        for i, b, m in runs:
            dst[i:i + m].copy_(rows[b:b + m])
    return out


def scatter_blocks(caches, block_ids: List[int], data: torch.Tensor) -> None:
    """Inverse of gather_blocks: write its flat bytes into the blocks."""
    n = len(block_ids)
    if not n:
        return
    data = data.to(caches[0][0].device).reshape(-1)
    runs = _runs(block_ids)
    for rows, off, size in _parts(caches, n):
        src = data[off:off + size].view(n, -1)
        for i, b, m in runs:
            rows[b:b + m].copy_(src[i:i + m])
