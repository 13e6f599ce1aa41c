"""KV-cache ops (vLLM signatures) -> csrc/kvcache/cache_ops{.cpp,_cpu.cpp,.cu}.

Cache layout per layer: ``[num_blocks, block_size, num_kv_heads, head_dim]``; any block size >= 1.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from .._backend import dl, kernel_op, lib_for, require_tensor, stream_of

__all__ = ["reshape_and_cache_flash", "copy_blocks", "swap_blocks"]


@kernel_op("reshape_and_cache_flash", mutates_args=("key_cache", "value_cache"))
def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
) -> None:
    """Write ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` into the paged caches at
    ``slot_mapping`` (slot = block * block_size + offset; ``-1`` = padding, skipped).

    As in vLLM, ``num_tokens = slot_mapping.size(0)`` and key/value may hold more rows (padding).
    key/value may be strided views (e.g. slices of a fused qkv output) as long as head_dim is
    contiguous. The caches must not share memory with each other or with the inputs (K and V halves
    of one buffer are fine).

    ``kv_cache_dtype`` (vLLM's names): "auto" = caches of key's dtype (scales ignored); "fp8" /
    "fp8_e4m3" / "fp8_e5m2" = uint8 caches of fp8 codes (e4m3fn, max 448; e5m2, max 57344);
    "int8" = int8 caches (codes in [-127, 127]). Stored code = saturate(round_nearest_even(x /
    scale)) with ``k_scale`` / ``v_scale`` float32 per tensor (0-d or ``[1]``) or per kv head
    ``[num_kv_heads]``; the attention ops read such caches directly (their ``kv_cache_dtype``)."""
    for t, name in ((key, "key"), (value, "value"), (key_cache, "key_cache"), (value_cache, "value_cache"),
                    (slot_mapping, "slot_mapping")):
        require_tensor(t, name)
    if not isinstance(kv_cache_dtype, str):
        raise TypeError(f"kv_cache_dtype: expected a str, got {type(kv_cache_dtype).__name__}")
    lib_for(key).reshape_and_cache_flash(
        dl(key), dl(value), dl(key_cache), dl(value_cache), dl(slot_mapping),
        kv_cache_dtype, dl(k_scale, "k_scale"), dl(v_scale, "v_scale"), stream_of(key),
    )


@reshape_and_cache_flash.op.register_fake
def _(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype="auto", k_scale=None, v_scale=None):
    return None


# Device tables of per-layer cache base pointers for the one-launch CUDA copy_blocks, keyed by
# the caches' addresses: built once per set of caches, not per call.
_layer_ptr_tables: dict = {}


def _layer_ptrs(key_caches: List[torch.Tensor], value_caches: List[torch.Tensor]) -> Optional[torch.Tensor]:
    if not key_caches or not key_caches[0].is_cuda:
        return None
    ptrs = tuple(p for k, v in zip(key_caches, value_caches) for p in (k.data_ptr(), v.data_ptr()))
    table = _layer_ptr_tables.get(ptrs)
    if table is None:
        table = torch.tensor(ptrs, dtype=torch.int64, device=key_caches[0].device)
        _layer_ptr_tables[ptrs] = table
    return table


@kernel_op("copy_blocks", mutates_args=("key_caches", "value_caches"))
def copy_blocks(key_caches: List[torch.Tensor], value_caches: List[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Copy whole blocks within each layer's caches: for every row ``(src, dst)`` of
    ``block_mapping [num_pairs, 2]``, ``cache[dst] = cache[src]`` for all layers, K and V.
    On CUDA one launch covers all layers and pairs.

    Pairs are independent and run in parallel, so a destination block may appear only once and
    may not also be a source (a chain a->b, b->c would depend on the order): such mappings raise
    ``ValueError`` (on CUDA checked under ``LLMKERN_DEBUG_CHECKS=1``, as other index values);
    copy in two calls instead."""
    if not isinstance(key_caches, (list, tuple)) or not isinstance(value_caches, (list, tuple)):
        raise TypeError("key_caches / value_caches: expected lists of per-layer cache tensors")
    require_tensor(block_mapping, "block_mapping")
    if not key_caches:
        if value_caches:
            raise ValueError(f"value_caches: has {len(value_caches)} layers but key_caches has 0")
        return
    for i, t in enumerate(list(key_caches) + list(value_caches)):
        require_tensor(t, f"key_caches[{i}]" if i < len(key_caches) else f"value_caches[{i - len(key_caches)}]")
    lib_for(key_caches[0]).copy_blocks(
        [dl(t) for t in key_caches], [dl(t) for t in value_caches], dl(block_mapping),
        dl(_layer_ptrs(key_caches, value_caches)), stream_of(key_caches[0]),
    )


@copy_blocks.op.register_fake
def _(key_caches, value_caches, block_mapping):
    return None


@kernel_op("swap_blocks", mutates_args=("dst",))
def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """Copy blocks between two caches: ``dst[d] = src[s]`` for each ``(s, d)`` row of
    ``block_mapping`` (a CPU tensor, as in vLLM). Any direction: CPU<->CPU, and with CUDA
    GPU<->GPU, GPU->CPU and CPU->GPU, queued asynchronously on the current stream (use pinned CPU
    memory for truly asynchronous host transfers). Pairs run in mapping order; ``src`` and ``dst``
    must not share memory (copy_blocks copies within one cache)."""
    require_tensor(src, "src")
    require_tensor(dst, "dst")
    require_tensor(block_mapping, "block_mapping")
    dev = src if src.is_cuda else dst
    lib_for(dev).swap_blocks(dl(src), dl(dst), dl(block_mapping), stream_of(dev))


@swap_blocks.op.register_fake
def _(src, dst, block_mapping):
    return None
