"""Scales of a quantised KV cache (EngineConfig.kv_cache_dtype "fp8" / "fp8_e4m3" / "fp8_e5m2" /
"int8"): calibrated once at engine start from the model's own keys and values on a short fixed
text, per layer and kv head, as vLLM's calculate_kv_scales does (scale = amax x margin / the
code's largest value), or fixed ones from EngineConfig.kv_scales."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..kvcache import alloc_caches
from ..layers.attention import AttnMetadata
from ..layers.kv_quant import CODE_MAX, KvCacheQuant, observe

# A fixed warm-up text: plain prose, code and numbers, so keys and values see ordinary ranges.
CALIBRATION_TEXT = (
    "The history of the printing press begins in the fifteenth century, when movable metal type "
    "made books cheap enough for ordinary readers. Within fifty years presses were running in more "
    "than two hundred towns across Europe, and the number of books in print rose into the millions.\n"
    "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n"
    "    return total / len(values)\n"
    "Q: What is 17 times 23? A: 17 x 23 = 391. Q: And 1024 / 8? A: 128.\n"
    "Rain fell over the harbour all night; by morning the fishing boats were back, their nets "
    "heavy, and the market by the water filled with voices, gulls and the smell of salt."
)

# Headroom over the calibrated amax for keys and values the warm-up text did not show. fp8 keeps
# its relative precision at every magnitude (floating point), so a generous margin costs only the
# tiniest values; int8's step grows with the scale, so its margin stays small.
MARGIN = {"fp8": 2.0, "fp8_e4m3": 2.0, "fp8_e5m2": 2.0, "int8": 1.2}


def calibration_ids(tokenizer, vocab_size: int) -> List[int]:
    if tokenizer is not None:
        ids = list(tokenizer.encode(CALIBRATION_TEXT))
        if ids:
            return ids
    return [(i * 7919 + 13) % vocab_size for i in range(256)]  # no tokenizer: a fixed spread of ids


def calibrate_amax(model, token_ids: Sequence[int]) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (k_amax, v_amax), float32 [num_kv_heads]: the largest |key| (after rotary) and
    |value| of each kv head over one dense prefill of token_ids; nothing is written to a cache."""
    n_layers, hkv, d = model.config.kv_layout
    device = model.device
    caches = alloc_caches(1, 1, n_layers, hkv, d, model.dtype, device)
    amax: List[Optional[Tuple[torch.Tensor, torch.Tensor]]] = [None] * n_layers

    def recorder(i: int):
        def fn(k: torch.Tensor, v: torch.Tensor) -> None:
            cur = (k.detach().abs().amax(dim=(0, 2)).float(), v.detach().abs().amax(dim=(0, 2)).float())
            amax[i] = cur if amax[i] is None else (torch.maximum(amax[i][0], cur[0]), torch.maximum(amax[i][1], cur[1]))
        return fn

    for i, (kc, _) in enumerate(caches):
        observe(kc, recorder(i))
    n = len(token_ids)
    ids = torch.tensor(token_ids, dtype=torch.int64, device=device)
    meta = AttnMetadata(slot_mapping=torch.full((n,), -1, dtype=torch.int64, device=device), num_prefill_tokens=n,
                        prefill_cu_q=torch.tensor([0, n], dtype=torch.int32, device=device), prefill_max_q=n)
    with torch.inference_mode():
        model.forward(ids, torch.arange(n, device=device), meta, caches)
    if any(a is None for a in amax):
        raise RuntimeError("kv_cache_dtype: calibration saw no key/value rows of some layer")
    return amax  # type: ignore[return-value]


def _fixed_scales(kv_scales, n_layers: int, hkv: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """EngineConfig.kv_scales: one number for every layer, head, K and V, or per layer a (k, v)
    pair whose entries are a number or a list of num_kv_heads numbers."""
    def heads(x, where: str) -> torch.Tensor:
        t = torch.tensor(x, dtype=torch.float32).reshape(-1)
        if t.numel() not in (1, hkv) or not bool(torch.isfinite(t).all()) or not bool((t > 0).all()):
            raise ValueError(f"kv_scales: {where} must be a positive number or {hkv} of them (one per kv head), got {x!r}")
        return t.expand(hkv).contiguous()

    if isinstance(kv_scales, (int, float)) and not isinstance(kv_scales, bool):
        s = heads(kv_scales, "the scale")
        return [(s, s)] * n_layers
    pairs = list(kv_scales)
    if len(pairs) != n_layers:
        raise ValueError(f"kv_scales: expected one (k_scale, v_scale) pair per layer ({n_layers}), got {len(pairs)}")
    out = []
    for i, pair in enumerate(pairs):
        try:
            k, v = pair
        except (TypeError, ValueError):
            raise ValueError(f"kv_scales: layer {i}: expected a (k_scale, v_scale) pair, got {pair!r}") from None
        out.append((heads(k, f"layer {i} k_scale"), heads(v, f"layer {i} v_scale")))
    return out


def kv_cache_quants(config, model, tokenizer) -> Optional[List[KvCacheQuant]]:
    """Per target-model layer, the quantisation its caches use; None for kv_cache_dtype "auto"."""
    kind = config.kv_cache_dtype
    if kind == "auto":
        return None
    n_layers, hkv, _ = model.config.kv_layout
    if config.kv_scales is not None:
        scales = _fixed_scales(config.kv_scales, n_layers, hkv)
    else:
        amax = calibrate_amax(model, calibration_ids(tokenizer, model.config.vocab_size))
        f = MARGIN[kind] / CODE_MAX[kind]
        # a head whose values are all zero still needs a positive scale
        scales = [((k * f).clamp_min(1e-8), (v * f).clamp_min(1e-8)) for k, v in amax]
    dev = model.device
    return [KvCacheQuant(kind, k.to(dev), v.to(dev)) for k, v in scales]


def quant_fingerprint(quants: Optional[List[KvCacheQuant]]) -> str:
    """What the cache's bytes depend on beyond the model: the kind and every scale (disk tier)."""
    if not quants:
        return ""
    arr = np.concatenate([t.cpu().numpy() for q in quants for t in (q.k_scale, q.v_scale)])
    return f"{quants[0].kv_cache_dtype}:{arr.tobytes().hex()}"
