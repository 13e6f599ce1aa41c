"""vLLM's ``vllm._custom_ops`` names for the kernels llmkern has (import as ``ops``):

    from llmkern.compat import vllm_ops as ops
    ops.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, "auto", k_scale, v_scale)

Same parameter names, order and in-place semantics as vLLM's wrappers (the ``_custom_ops``
module of the vLLM 0.9 - 0.11 series): the KV-cache ops (``reshape_and_cache_flash``,
``copy_blocks``, ``swap_blocks``), the RMS norms (``rms_norm``, ``fused_add_rms_norm``), the
rotary embedding (``rotary_embedding``, key optional) and ``silu_and_mul`` (vLLM's
``torch.ops._C.silu_and_mul``). Only ``kv_cache_dtype="auto"`` caches (fp32 / fp16 / bf16);
vLLM's other ops (fp8 conversion, the older 5-D ``reshape_and_cache`` layout, MLA caches,
quantised norms) are not provided.
"""
from ..ops.kvcache import copy_blocks, reshape_and_cache_flash, swap_blocks  # noqa: F401
from ..ops.layernorm import fused_add_rms_norm, rms_norm, silu_and_mul  # noqa: F401
from ..ops.rotary import rotary_embedding  # noqa: F401

__all__ = ["copy_blocks", "fused_add_rms_norm", "reshape_and_cache_flash", "rms_norm",
           "rotary_embedding", "silu_and_mul", "swap_blocks"]
