"""flash-attn 2.8 (``import flash_attn``) on llmkern's kernels: the same function names,
parameters, defaults and returns (see llmkern.ops.attention for what is and is not honoured).

    from llmkern.compat.flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

Also flash-attn's inference helpers, forward only: ``.bert_padding``, ``.layers.rotary``
(``apply_rotary_emb`` and friends) and ``.ops`` (``rms_norm``, ``triton.layer_norm.rms_norm_fn``).
"""
from .flash_attn_interface import (  # noqa: F401
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

__version__ = "2.8.4"  # the flash-attn release whose API this follows

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]
