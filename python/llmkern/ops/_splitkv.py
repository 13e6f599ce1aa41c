"""Split-KV ("flash-decoding") for the CUDA attention kernels: how many splits, and the float32
workspace their partial results go to. The CUDA kernels never allocate, so the wrapper of
flash_attn_with_kvcache allocates it here (through torch's caching allocator, which CUDA-graph
capture supports) and passes it down; the CPU kernels manage their own.

Layout (csrc/attention/flash_attn.h): out partials [splits, b*s, Hq, D] then lse [splits, b*s, Hq].
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Tuple

import torch

from .. import _C

MAX_SPLITS = 128          # the kernels' limit
_DECODE_ROWS = 16         # query rows per CTA of the decode-shaped kernel
_DECODE_MAX_ROWS = 32     # above this many rows per kv head the prefill kernel runs (128-row tiles)
_MIN_KEYS_PER_SPLIT = 256  # below this a split's 4 warps get too few key tiles to stream


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def auto_num_splits(batch: int, seqlen_q: int, num_heads: int, num_kv_heads: int, max_keys: int,
                    sm_count: int) -> int:
    """Fewest splits that fill the GPU about as well as the best count does (flash-attn's rule:
    wave efficiency within 85% of the best), 1 when the grid already fills it."""
    group = max(1, num_heads // max(1, num_kv_heads))
    rows = seqlen_q * group
    tile = _DECODE_ROWS if rows <= _DECODE_MAX_ROWS else 128
    ctas = batch * num_kv_heads * math.ceil(rows / tile)
    slots = 2 * sm_count  # resident CTAs per wave, about
    if ctas == 0 or ctas >= 0.8 * slots:
        return 1
    limit = min(MAX_SPLITS, slots, max(1, max_keys // _MIN_KEYS_PER_SPLIT))
    effs = []
    for n in range(1, limit + 1):
        waves = math.ceil(ctas * n / slots)
        effs.append(ctas * n / (waves * slots))
    best = max(effs)
    return next(n for n, e in enumerate(effs, 1) if e >= 0.85 * best)


def split_workspace(lib, q: torch.Tensor, k_cache: torch.Tensor, block_table: Optional[torch.Tensor],
                    num_splits: int) -> Tuple[int, Optional[torch.Tensor]]:
    """(num_splits, workspace) for a flash_attn_with_kvcache call. CPU kernels: unchanged
    arguments (they choose and allocate themselves). CUDA kernels (a GPU, or the SIMT emulator):
    a concrete count (0 = auto) and a workspace when it is > 1."""
    if lib is _C and not q.is_cuda:
        return num_splits, None
    b, s, hq, d = q.shape
    hkv = k_cache.shape[2] if k_cache.dim() == 4 else 1
    if num_splits <= 0:
        if not q.is_cuda:  # emulator: no SMs to fill
            return 1, None
        if block_table is not None and block_table.dim() == 2:
            max_keys = block_table.shape[1] * k_cache.shape[1]
        else:
            max_keys = k_cache.shape[1] if k_cache.dim() == 4 else 0
        index = q.device.index if q.device.index is not None else torch.cuda.current_device()
        num_splits = auto_num_splits(b, s, hq, hkv, max_keys, _sm_count(index))
    num_splits = min(num_splits, MAX_SPLITS)
    if num_splits <= 1 or b * s * hq * d == 0:
        return 1, None
    ws = torch.empty(num_splits * b * s * hq * (d + 1), dtype=torch.float32, device=q.device)
    return num_splits, ws
