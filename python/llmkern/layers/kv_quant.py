"""Quantised KV caches (vLLM's ``kv_cache_dtype``: "fp8" = "fp8_e4m3", "fp8_e5m2", plus "int8")
at the layer level: the names, the storage dtype, and which caches hold codes with what scales.

The scales travel with the cache tensors themselves (an attribute set when the engine allocates
them), so a model's layer loop keeps passing ``(k_cache, v_cache)`` and paged_attention finds
the quantisation of the cache it is handed."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

import torch

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")

# Largest code value of each kind: a scale maps the calibrated amax (with a margin) onto it.
CODE_MAX = {"fp8": 448.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0, "int8": 127.0}

_QUANT_ATTR = "_llmk_kv_quant"
_OBSERVER_ATTR = "_llmk_kv_observer"


def check_kv_cache_dtype(value) -> str:
    """The value itself when it is one of KV_CACHE_DTYPES; else ValueError naming kv_cache_dtype."""
    if not isinstance(value, str) or value not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype: expected one of {', '.join(KV_CACHE_DTYPES)}, got {value!r}")
    return value


def storage_dtype(kv_cache_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """The cache tensors' dtype: the model's for "auto", else 1-byte codes (uint8 for fp8, as vLLM)."""
    if check_kv_cache_dtype(kv_cache_dtype) == "auto":
        return dtype
    return torch.int8 if kv_cache_dtype == "int8" else torch.uint8


@dataclass(frozen=True)
class KvCacheQuant:
    kv_cache_dtype: str
    k_scale: torch.Tensor  # float32 [num_kv_heads] (or [1]), on the caches' device
    v_scale: torch.Tensor

    def kwargs(self) -> dict:
        return dict(kv_cache_dtype=self.kv_cache_dtype, k_scale=self.k_scale, v_scale=self.v_scale)


def attach(k_cache: torch.Tensor, v_cache: torch.Tensor, quant: Optional[KvCacheQuant]) -> None:
    """Mark one layer's caches as holding codes with these scales (None: plain caches)."""
    for t in (k_cache, v_cache):
        setattr(t, _QUANT_ATTR, quant)


def quant_kwargs(k_cache: torch.Tensor) -> dict:
    """The attention / cache-write ops' quantisation arguments for this cache ({} for a plain one)."""
    q = getattr(k_cache, _QUANT_ATTR, None)
    return q.kwargs() if q is not None else {}


def cache_format(caches: Sequence[Tuple[torch.Tensor, torch.Tensor]]) -> Optional[str]:
    """What another engine must match to read these caches' blocks (prefill-decode hand-over): the
    kind ("fp8" as "fp8_e4m3") and a digest of every layer's scales; None for plain caches."""
    quants = [getattr(k, _QUANT_ATTR, None) for k, _ in caches]
    if not quants or quants[0] is None:
        return None
    h = hashlib.blake2b(digest_size=8)
    for q in quants:
        for t in (q.k_scale, q.v_scale):
            h.update(bytes(t.detach().float().cpu().contiguous().view(torch.uint8).tolist()))
    kind = quants[0].kv_cache_dtype
    return f"{'fp8_e4m3' if kind == 'fp8' else kind}:{h.hexdigest()}"


def observe(k_cache: torch.Tensor, fn: Optional[Callable[[torch.Tensor, torch.Tensor], None]]) -> None:
    """Calibration: fn(k, v) sees the key / value rows written into this (plain) cache."""
    setattr(k_cache, _OBSERVER_ATTR, fn)


def observer_of(k_cache: torch.Tensor) -> Optional[Callable[[torch.Tensor, torch.Tensor], None]]:
    return getattr(k_cache, _OBSERVER_ATTR, None)
