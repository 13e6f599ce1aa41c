"""The paged KV cache's memory: how many blocks fit (sizing), the block tensors of every tier
(device, host offload, swap) and copies between tiers, and whole-block gathers for hand-over.

Below both the engine (which puts its block bookkeeping, KVCacheManager, on top of these tensors)
and distributed/ (whose worker ranks hold the same tiers for their shard of the model)."""
from .spec import Caches, KVSpec, LayerGroup
from .sizing import CPU_KV_DEFAULT_GIB, kv_block_bytes, kv_block_counts
from .tiers import KVTiers, alloc_caches, build_kv_tiers

__all__ = ["Caches", "KVSpec", "LayerGroup", "CPU_KV_DEFAULT_GIB", "kv_block_bytes", "kv_block_counts",
           "KVTiers", "alloc_caches", "build_kv_tiers"]
