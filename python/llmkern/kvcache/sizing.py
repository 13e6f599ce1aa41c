"""How many KV blocks each tier gets: from explicit block counts, else from memory budgets, checked
against what the machine can still give before anything is zero-filled."""
from __future__ import annotations

from typing import List, Tuple

import torch

from .memory import check_fits, host_available_bytes
from .spec import KVSpec, LayerGroup

_GiB = 1 << 30
CPU_KV_DEFAULT_GIB = 2.0  # the CPU KV budget when none is given (per machine: ranks on it split it)


def kv_budget_bytes(spec: KVSpec, device: torch.device) -> float:
    """Memory for the device KV blocks: kv_cache_memory_gb, else on a GPU the part of
    gpu_memory_utilization not used yet (weights loaded), else CPU_KV_DEFAULT_GIB."""
    if spec.kv_cache_memory_gb is not None:
        return spec.kv_cache_memory_gb * _GiB
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return max(0.0, total * spec.gpu_memory_utilization - (total - free))
    avail = host_available_bytes()  # the CPU default never takes more than half of what is free
    default = CPU_KV_DEFAULT_GIB * _GiB
    return default if avail is None else min(default, avail / 2)


def kv_block_counts(spec: KVSpec, layers: List[LayerGroup], dtype: torch.dtype,
                    device: torch.device) -> Tuple[int, int, int]:
    """(device blocks, CPU offload blocks, swap blocks) for a cache of `layers`: from the block
    counts in spec, else from its memory budgets."""
    block_bytes = kv_block_bytes(layers, dtype, spec.block_size)
    num_blocks = spec.num_gpu_blocks
    if num_blocks is None:
        num_blocks = int(kv_budget_bytes(spec, device) // block_bytes)
    if num_blocks < 1:
        raise ValueError(f"kv_cache_memory_gb: leaves room for {num_blocks} KV blocks; need at least 1")
    n_off = spec.num_cpu_offload_blocks
    if n_off is None:
        n_off = int(spec.cpu_offload_gb * _GiB // block_bytes)
    n_swap = spec.num_swap_blocks
    if n_swap is None:
        n_swap = int(spec.swap_space_gb * _GiB // block_bytes)
    return num_blocks, n_off, n_swap


def kv_block_bytes(layers: List[LayerGroup], dtype: torch.dtype, block_size: int) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return sum(2 * n * h * d for n, h, d in layers) * elem * block_size


def check_kv_memory(spec: KVSpec, device: torch.device, n_dev: int, n_host: int, block_bytes: int) -> None:
    """Before any cache is zero-filled: the device blocks and the host tiers must fit the machine."""
    what = (f"num_gpu_blocks={n_dev} x block_size={spec.block_size}" if spec.num_gpu_blocks is not None
            else "kv_cache_memory_gb") + " (KV cache)"
    host_what = "cpu_offload_gb / swap_space_gb (host KV blocks)"
    if device.type == "cpu":
        check_fits((n_dev + n_host) * block_bytes, device, what if n_host == 0 else f"{what} + {host_what}")
    else:
        check_fits(n_dev * block_bytes, device, what)
        check_fits(n_host * block_bytes, "cpu", host_what)
