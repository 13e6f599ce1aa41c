"""What FlashInfer's attention entry points share: their arguments in llmkern's terms (layouts,
positional encodings, scales), the paged cache's views, RoPE as FlashInfer applies it, and the
lse convention (FlashInfer's lse is base 2, ``[tokens, heads]``; llmkern's kernels give the
natural log, heads first)."""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch

from ..._args import float_arg, int_arg, require_tensor

LOG2E = 1.0 / math.log(2.0)
POS_ENCODING_MODES = ("NONE", "ROPE_LLAMA", "ALIBI")
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def check_layout(kv_layout: str) -> str:
    if kv_layout not in ("NHD", "HND"):
        raise KeyError(f"Invalid kv_layout {kv_layout}")
    return kv_layout


def check_pos_encoding(mode) -> str:
    # FlashInfer also takes the enum's int values (0 = NONE, 1 = ROPE_LLAMA, 2 = ALIBI).
    if isinstance(mode, int) and not isinstance(mode, bool) and 0 <= mode < 3:
        return POS_ENCODING_MODES[mode]
    if mode not in POS_ENCODING_MODES:
        raise KeyError(f"Invalid pos_encoding_mode {mode}")
    return mode


def check_dtypes(q: torch.Tensor, k: torch.Tensor) -> None:
    """FP8 caches (and mixed q / kv dtypes) are outside the kernels: fp32 / fp16 / bf16, one dtype."""
    for t, name in ((q, "q"), (k, "kv cache")):
        if t.dtype not in _FLOATS:
            raise NotImplementedError(f"{name}: dtype {t.dtype} is not supported by llmkern's attention "
                                      "(fp32 / fp16 / bf16 only; no fp8 KV cache)")
    if q.dtype != k.dtype:
        raise NotImplementedError(f"q: dtype {q.dtype} differs from the kv cache's {k.dtype} "
                                  "(llmkern's kernels take one dtype)")


def sm_scale_of(sm_scale, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if sm_scale is None else float_arg(sm_scale, "sm_scale")


def soft_cap_of(logits_soft_cap) -> float:
    return 0.0 if logits_soft_cap is None else float_arg(logits_soft_cap, "logits_soft_cap")


def window_of(window_left) -> int:
    return -1 if window_left is None else int_arg(window_left, "window_left")


def unpack_paged(paged_kv_cache: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]],
                 kv_layout: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """K and V as views ``[num_pages, page_size, num_kv_heads, head_dim]`` (no copy: the kernels
    take strided pages). Accepts one tensor ``[num_pages, 2, ...]`` or a ``(k, v)`` tuple."""
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError("paged_kv_cache: expected a (k_cache, v_cache) pair")
        k, v = paged_kv_cache
        require_tensor(k, "paged_k_cache", 4, "[num_pages, page_size, num_kv_heads, head_dim]")
        require_tensor(v, "paged_v_cache", 4, "[num_pages, page_size, num_kv_heads, head_dim]")
    else:
        require_tensor(paged_kv_cache, "paged_kv_cache", 5, "[num_pages, 2, ...]")
        if paged_kv_cache.shape[1] != 2:
            raise ValueError(f"paged_kv_cache: dim 1 must be 2 (K and V), got shape {tuple(paged_kv_cache.shape)}")
        k, v = paged_kv_cache[:, 0], paged_kv_cache[:, 1]
    if kv_layout == "HND":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    return k, v


def dense_kv(t: torch.Tensor, kv_layout: str) -> torch.Tensor:
    """A single sequence's K or V as ``[kv_len, num_kv_heads, head_dim]`` (a view)."""
    return t.transpose(0, 1) if kv_layout == "HND" else t


def alibi_slopes(num_heads: int, device) -> torch.Tensor:
    """The ALiBi paper's head slopes (FlashInfer's choice for ``pos_encoding_mode="ALIBI"``):
    a geometric series from 2^(-8/n) for the largest power of two n <= heads, the rest
    interleaved from the series of 2n."""
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    slopes += [2.0 ** (-4.0 * (2 * i + 1) / n) for i in range(num_heads - n)]
    return torch.tensor(slopes, dtype=torch.float32, device=device)


def rope_llama(x: torch.Tensor, positions: torch.Tensor, rope_scale, rope_theta) -> torch.Tensor:
    """``x [n, H, D]`` rotated at ``positions [n]`` as FlashInfer's ROPE_LLAMA does: halves
    (i, i + D/2) paired, angle ``pos / rope_scale * theta^(-2i/D)``, computed in fp32 and
    rounded once to x's dtype."""
    scale = 1.0 if rope_scale is None else float_arg(rope_scale, "rope_scale")
    theta = 1e4 if rope_theta is None else float_arg(rope_theta, "rope_theta")
    d = x.shape[-1]
    half = d // 2
    inv = torch.pow(theta, -torch.arange(half, dtype=torch.float32, device=x.device) * 2.0 / d) / scale
    ang = positions.to(torch.float32)[:, None] * inv[None]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    xf = x.float()
    a, b = xf[..., :half], xf[..., half:2 * half]
    out = torch.cat([a * cos - b * sin, b * cos + a * sin, xf[..., 2 * half:]], dim=-1)
    return out.to(x.dtype)


def lse_out(lse_nat: torch.Tensor, lse: Optional[torch.Tensor]) -> torch.Tensor:
    """llmkern's natural-log lse ``[..., tokens]`` with heads before tokens -> FlashInfer's base-2
    ``[tokens, heads]``; rows that saw no key are -inf (llmkern marks them +inf). Written into
    ``lse`` when given (device work only)."""
    t = lse_nat.transpose(-1, -2)
    res = torch.where(torch.isinf(t), torch.full_like(t, float("-inf")), t * LOG2E)
    if lse is None:
        return res.contiguous()
    lse.copy_(res.reshape(lse.shape))
    return lse


def check_heads(num_qo_heads: int, num_kv_heads: int) -> None:
    if num_kv_heads <= 0 or num_qo_heads % num_kv_heads != 0:
        raise ValueError(f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")


def unsupported(**kw) -> None:
    """FlashInfer options llmkern's kernels do not have: accepted at their default, else rejected."""
    for name, value in kw.items():
        if value is not None and value is not False and not (isinstance(value, (int, float)) and value == 0):
            raise NotImplementedError(f"{name}: not supported by llmkern's attention")
