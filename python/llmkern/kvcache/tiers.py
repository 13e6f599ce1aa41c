"""The KV block tensors of every tier and the copies between them: the device cache the attention
kernels read, the host offload tier for evicted prefix blocks and the host swap space for
preempted sequences. Copies go through the swap_blocks kernel, batched per layer."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ..layers.kv_quant import storage_dtype
from ..models.hugepages import zeros_on_hugepages
from ..ops.kvcache import swap_blocks
from .prefault import populate
from .sizing import check_kv_memory, kv_block_bytes, kv_block_counts
from .spec import Caches, KVSpec, LayerGroup


def alloc_caches(num_blocks: int, block_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device, pin: bool = False) -> Caches:
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    pin = pin and torch.cuda.is_available()
    if torch.device(device).type == "cpu" and not pin:
        flat = zeros_on_hugepages([shape] * (2 * num_layers), dtype)
        return [(flat[2 * i], flat[2 * i + 1]) for i in range(num_layers)]
    return [tuple(torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin) for _ in range(2))
            for _ in range(num_layers)]


class KVTiers:
    """Per layer (key, value) block tensors of each tier; offload and swap may be None (off)."""

    def __init__(self, caches: Caches, offload_caches: Optional[Caches] = None,
                 swap_caches: Optional[Caches] = None):
        self.caches = caches
        self.offload_caches = offload_caches
        self.swap_caches = swap_caches

    def prefault(self) -> Optional[str]:
        """Fault the device tier's pages in now (CPU; kvcache/prefault.py): why not, or None."""
        if not self.caches or self.caches[0][0].device.type != "cpu":
            return "not a CPU cache"
        return populate([t for kv in self.caches for t in kv])

    def tier(self, name: str) -> Caches:
        """The caches of one tier: "device", "offload" or "swap"."""
        return {"device": self.caches, "offload": self.offload_caches, "swap": self.swap_caches}[name]

    def copy_blocks_between(self, src: str, dst: str, pairs: List[Tuple[int, int]]) -> None:
        """Copy (src block, dst block) pairs between two tiers, every layer."""
        if not pairs:
            return
        mapping = torch.tensor(pairs, dtype=torch.int64).view(-1, 2)
        for (sk, sv), (dk, dv) in zip(self.tier(src), self.tier(dst)):
            swap_blocks(sk, dk, mapping)
            swap_blocks(sv, dv, mapping)


def build_kv_tiers(spec: KVSpec, layers: List[LayerGroup], dtype: torch.dtype, device: torch.device) -> KVTiers:
    """Size and allocate the tiers for `layers` (the target model, then a draft model whose layers
    share the block ids), of `dtype` elements or spec.kv_cache_dtype's 1-byte codes: device blocks
    from num_gpu_blocks or the memory budget, the CPU offload tier (with prefix caching) and the
    swap space (with swap preemption) from their block counts or GiB."""
    bs = spec.block_size
    dtype = storage_dtype(spec.kv_cache_dtype, dtype)  # 1 byte per element for fp8 / int8 caches
    num_blocks, n_off, n_swap = kv_block_counts(spec, layers, dtype, device)

    def alloc(n: int, dev, pin: bool = False) -> Caches:
        return [c for g in layers for c in alloc_caches(n, bs, *g, dtype, dev, pin=pin)]

    n_off = n_off if spec.enable_prefix_caching else 0
    n_swap = n_swap if spec.preemption_mode == "swap" else 0
    check_kv_memory(spec, device, num_blocks, n_off + n_swap, kv_block_bytes(layers, dtype, bs))
    offload = alloc(n_off, "cpu", pin=True) if n_off else None
    swap = alloc(n_swap, "cpu", pin=True) if n_swap else None
    return KVTiers(alloc(num_blocks, device), offload, swap)
