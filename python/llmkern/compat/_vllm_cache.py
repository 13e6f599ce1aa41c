"""vLLM's cache ops whose current signatures differ from llmkern's kernels: ``swap_blocks`` with
its byte size (vLLM 0.11+), the older 5-D ``reshape_and_cache`` layout, and vLLM's rounding of
``rotary_embedding`` in half precision. Device work in torch ops (no host sync)."""
from __future__ import annotations

from typing import Optional

import torch

from .._args import int_arg, require_tensor
from .._backend import kernel_op
from ..ops import kvcache as _kv
from ..ops import rotary as _rotary


def _blocks_as_bytes(t: torch.Tensor, block_bytes: int) -> torch.Tensor:
    """``t``'s memory as ``[num_blocks, block_bytes]`` uint8 rows, block b at ``b * stride(0)``."""
    es = t.element_size()
    stride = t.stride(0) * es if t.dim() else block_bytes
    count = t.shape[0] if t.dim() else 1
    raw = torch.empty(0, dtype=torch.uint8, device=t.device)
    return raw.set_(t.untyped_storage(), t.storage_offset() * es, (count, block_bytes), (stride, 1))


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_size_in_bytes, block_mapping=None) -> None:
    """``swap_blocks(src, dst, block_size_in_bytes, block_mapping)`` (vLLM 0.11+): for each
    ``(s, d)`` row of ``block_mapping``, the first ``block_size_in_bytes`` bytes of block d of
    ``dst`` become those of block s of ``src`` (a block is a step of dim 0). The older
    ``swap_blocks(src, dst, block_mapping)`` runs llmkern's kernel."""
    if isinstance(block_size_in_bytes, torch.Tensor) and block_mapping is None:
        return _kv.swap_blocks(src, dst, block_size_in_bytes)
    require_tensor(block_mapping, "block_mapping", 2, "[num_pairs, 2]")
    _swap_block_bytes(src, dst, int_arg(block_size_in_bytes, "block_size_in_bytes", 0), block_mapping)


@kernel_op("vllm_swap_blocks", mutates_args=("dst",))
def _swap_block_bytes(src: torch.Tensor, dst: torch.Tensor, block_size_in_bytes: int,
                      block_mapping: torch.Tensor) -> None:
    # A custom op of its own (vLLM's schema) so that torch.compile traces it and opcheck sees it.
    require_tensor(src, "src")
    require_tensor(dst, "dst")
    nbytes = block_size_in_bytes
    for t, name in ((src, "src"), (dst, "dst")):
        if t.dim() and nbytes > t.stride(0) * t.element_size():
            raise ValueError(f"block_size_in_bytes: {nbytes} is more than one block of {name}")
    pairs = block_mapping.to("cpu", torch.int64)
    s_b, d_b = _blocks_as_bytes(src, nbytes), _blocks_as_bytes(dst, nbytes)
    d_b[pairs[:, 1].to(dst.device)] = s_b[pairs[:, 0].to(src.device)].to(dst.device)


_swap_block_bytes.op.register_fake(lambda *args: None)  # in place: nothing to return when traced
swap_blocks.op = _swap_block_bytes.op  # what torch.ops._C_cache_ops.swap_blocks names


@kernel_op("vllm_reshape_and_cache", mutates_args=("key_cache", "value_cache"))
def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, kv_cache_dtype: str = "auto",
                      k_scale: Optional[torch.Tensor] = None, v_scale: Optional[torch.Tensor] = None) -> None:
    """vLLM's older paged layout: ``key_cache [num_blocks, H, head_size / x, block_size, x]``,
    ``value_cache [num_blocks, H, head_size, block_size]``; slot = block * block_size + offset,
    -1 skipped. ``kv_cache_dtype`` as reshape_and_cache_flash's ("auto", or fp8 / int8 codes with
    k_scale / v_scale per tensor or per head; the same codes, here from torch's casts)."""
    for t, name in ((key, "key"), (value, "value"), (slot_mapping, "slot_mapping")):
        require_tensor(t, name)
    require_tensor(key_cache, "key_cache", 5, "[num_blocks, num_heads, head_size / x, block_size, x]")
    require_tensor(value_cache, "value_cache", 4, "[num_blocks, num_heads, head_size, block_size]")
    nb, h, dx, bs, x = key_cache.shape
    slots = slot_mapping.reshape(-1).long()
    n = slots.numel()
    keep = slots >= 0
    blk, off = slots[keep] // bs, slots[keep] % bs
    k = _codes(key[:n].reshape(n, h, dx, x)[keep], key_cache, "key_cache", kv_cache_dtype, k_scale, "k_scale")
    v = _codes(value[:n].reshape(n, h, -1)[keep], value_cache, "value_cache", kv_cache_dtype, v_scale, "v_scale")
    key_cache.permute(0, 3, 1, 2, 4)[blk, off] = k
    value_cache.permute(0, 3, 1, 2)[blk, off] = v


reshape_and_cache.op.register_fake(lambda *args: None)  # in place: nothing to return when traced

# kv_cache_dtype -> (torch dtype of the codes, largest code value); int8 rounds half to even.
_CODES = {"fp8": (torch.float8_e4m3fn, 448.0), "fp8_e4m3": (torch.float8_e4m3fn, 448.0),
          "fp8_e5m2": (torch.float8_e5m2, 57344.0), "int8": (torch.int8, 127.0)}


def _codes(x: torch.Tensor, cache: torch.Tensor, cache_name: str, kv_cache_dtype: str,
           scale: Optional[torch.Tensor], scale_name: str) -> torch.Tensor:
    """x [n, H, ...] as the cache stores it: cast ("auto"), or saturated codes of x / scale."""
    if kv_cache_dtype == "auto":
        return x.to(cache.dtype)
    if kv_cache_dtype not in _CODES:
        raise ValueError(f"kv_cache_dtype: expected one of 'auto', {', '.join(map(repr, _CODES))}, got {kv_cache_dtype!r}")
    want = torch.int8 if kv_cache_dtype == "int8" else torch.uint8
    if cache.dtype != want:
        raise TypeError(f"{cache_name}: kv_cache_dtype {kv_cache_dtype!r} stores {want} codes, got a {cache.dtype} cache")
    h = x.shape[1]
    if scale is None or scale.dtype != torch.float32 or scale.numel() not in (1, h):
        raise ValueError(f"{scale_name}: required, float32 [1] or [num_heads={h}] for kv_cache_dtype {kv_cache_dtype!r}")
    dt, top = _CODES[kv_cache_dtype]
    y = (x.float() / scale.reshape(1, -1, *[1] * (x.dim() - 2))).clamp(-top, top)
    return y.round().to(dt) if dt == torch.int8 else y.to(dt).view(torch.uint8)


@kernel_op("vllm_rotary_embedding", mutates_args=("query", "key"))
def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor], head_size: int,
                     cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    """vLLM's ``rotary_embedding``. fp32 runs llmkern's kernel. fp16 / bf16 round as vLLM does:
    its kernel and its reference compute ``x * cos - y * sin`` with every product and sum
    rounded to the input dtype (cos / sin in that dtype too), so results are vLLM's to the bit;
    llmkern's kernel (``llmkern.ops.rotary_embedding``) rounds once from fp32, which is closer
    to exact but differs from vLLM by an ulp, more than vLLM's own tests allow."""
    if query.dtype == torch.float32:
        return _rotary.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
    hs = int_arg(head_size, "head_size", 1)
    pos = positions.reshape(-1).long()
    cs = cos_sin_cache.index_select(0, pos).to(query.dtype)
    rot = cs.shape[-1]
    cos, sin = cs[:, None, :rot // 2], cs[:, None, rot // 2:]
    for t in (query, key):
        if t is not None:
            _rotate_rows(t, pos.numel(), hs, rot, cos, sin, is_neox)


rotary_embedding.op.register_fake(lambda *args: None)  # in place: nothing to return when traced


def _rotate_rows(t, n: int, hs: int, rot: int, cos, sin, is_neox: bool) -> None:
    try:
        x = t.view(n, -1, hs)  # in place when the layout allows a view (flat or per-head rows)
    except RuntimeError:
        x = t.reshape(n, -1, hs)
    r = x[..., :rot]
    a, b = (r[..., :rot // 2], r[..., rot // 2:]) if is_neox else (r[..., 0::2], r[..., 1::2])
    o1, o2 = a * cos - b * sin, b * cos + a * sin
    r.copy_(torch.cat([o1, o2], dim=-1) if is_neox else torch.stack([o1, o2], dim=-1).flatten(-2))
    if x.data_ptr() != t.data_ptr() or x.untyped_storage().data_ptr() != t.untyped_storage().data_ptr():
        t.copy_(x.reshape(t.shape))
