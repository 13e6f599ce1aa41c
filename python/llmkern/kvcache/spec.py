"""KVSpec: the KV-cache settings its sizing and allocation need (a slice of EngineConfig), small
enough to hand to every model-parallel rank."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

Caches = List[Tuple[torch.Tensor, torch.Tensor]]  # per layer (key_cache, value_cache)
LayerGroup = Tuple[int, int, int]  # (num_layers, num_kv_heads, head_dim) of one model


@dataclass(frozen=True)
class KVSpec:
    block_size: int = 16
    kv_cache_memory_gb: Optional[float] = None  # None: CPU_KV_DEFAULT_GIB on CPU, gpu_memory_utilization on GPU
    gpu_memory_utilization: float = 0.85
    num_gpu_blocks: Optional[int] = None        # overrides the memory budget
    enable_prefix_caching: bool = True          # the offload tier exists only with prefix caching
    cpu_offload_gb: float = 0.0
    num_cpu_offload_blocks: Optional[int] = None
    swap_space_gb: float = 1.0
    num_swap_blocks: Optional[int] = None
    preemption_mode: str = "recompute"          # the swap tier exists only with "swap"
    kv_cache_dtype: str = "auto"                # "auto": the model dtype; fp8 / int8: 1-byte codes
