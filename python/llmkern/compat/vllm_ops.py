"""vLLM's ``vllm._custom_ops`` names for the kernels llmkern has (import as ``ops``):

    from llmkern.compat import vllm_ops as ops
    ops.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, "auto", k_scale, v_scale)

Follows vLLM's ``_custom_ops`` as of its late-2026 main branch (parameter names, order,
defaults and in-place semantics) and keeps accepting the 0.9 - 0.11 forms where they do not
collide:

- KV cache: ``reshape_and_cache_flash``, the older 5-D ``reshape_and_cache``, ``copy_blocks``,
  ``swap_blocks(src, dst, block_size_in_bytes, block_mapping)`` (the old
  ``swap_blocks(src, dst, block_mapping)`` still works). ``kv_cache_dtype`` "auto" (fp32 / fp16 /
  bf16 caches), "fp8" / "fp8_e4m3" / "fp8_e5m2" (uint8 caches) and "int8" with ``k_scale`` /
  ``v_scale`` per tensor or per head; no MLA caches.
- Norms: ``rms_norm`` (``weight=None``: no scale), ``fused_add_rms_norm``; ``silu_and_mul``
  (``torch.ops._C.silu_and_mul``). No quantised norms.
- Rotary: ``rotary_embedding`` (key optional), rounding as vLLM does in fp16 / bf16 (see
  :func:`._vllm_cache.rotary_embedding` for why).
- MoE (``vllm._moe_C``): ``topk_softmax`` / ``topk_sigmoid`` (score-correction bias, routed
  scaling, padding rows), ``moe_align_block_size`` (``expert_map``; unused expert blocks 0, as
  vLLM), ``batched_moe_align_block_size``, and ``fused_experts(hidden_states, w1, w2,
  topk_weights, topk_ids, inplace=False, activation="silu", expert_map=None)`` of
  ``vllm.model_executor.layers.fused_moe`` (unquantised weights only).
"""
from typing import Optional

import torch

from ..ops import moe as _moe
from .._backend import kernel_op
from ..ops import layernorm as _norm
from ..ops.kvcache import copy_blocks, reshape_and_cache_flash  # noqa: F401
from ..ops.layernorm import silu_and_mul  # noqa: F401
from ._vllm_cache import reshape_and_cache, rotary_embedding, swap_blocks  # noqa: F401
from ._vllm_moe import batched_moe_align_block_size, moe_align_block_size, topk_sigmoid, topk_softmax  # noqa: F401


@kernel_op("vllm_rms_norm", mutates_args=("out",))
def rms_norm(out: torch.Tensor, input: torch.Tensor, weight: Optional[torch.Tensor], epsilon: float) -> None:
    """``out = input * rsqrt(mean(input^2) + epsilon) * weight``; ``weight=None`` leaves out the
    scale (vLLM's norms without an elementwise affine). A custom op of its own so that its
    schema takes the optional weight, as vLLM's does."""
    _norm.rms_norm(out, input, _unit_weight(input) if weight is None else weight, epsilon)


@kernel_op("vllm_fused_add_rms_norm", mutates_args=("input", "residual"))
def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor],
                       epsilon: float) -> None:
    """In place: ``residual += input``, then ``input = rms_norm(residual) * weight`` (``weight=None``:
    no scale)."""
    _norm.fused_add_rms_norm(input, residual, _unit_weight(input) if weight is None else weight, epsilon)


for _op in (rms_norm, fused_add_rms_norm):  # in place: nothing to return when traced
    _op.op.register_fake(lambda *args: None)


def _unit_weight(x: torch.Tensor) -> torch.Tensor:
    return torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)


def fused_experts(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, inplace: bool = False, activation: str = "silu",
                  expert_map=None, **unsupported) -> torch.Tensor:
    """vLLM's ``fused_experts`` for unquantised weights (``w1`` = vLLM's stacked gate/up ``w13``)."""
    bad = {k: v for k, v in unsupported.items() if v not in (None, False)}
    if bad:
        raise NotImplementedError(f"{sorted(bad)[0]}: not supported by llmkern's fused_moe (unquantised only)")
    return _moe.fused_moe(hidden_states, w1, w2, topk_weights, topk_ids, activation=activation,
                          expert_map=expert_map, out=hidden_states if inplace else None)


__all__ = ["batched_moe_align_block_size", "copy_blocks", "fused_add_rms_norm", "fused_experts",
           "moe_align_block_size", "reshape_and_cache", "reshape_and_cache_flash", "rms_norm",
           "rotary_embedding", "silu_and_mul", "swap_blocks", "topk_sigmoid", "topk_softmax"]
