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

MoE: ``topk_softmax`` and ``moe_align_block_size`` in vLLM's in-place form (the caller's output
buffers, ``vllm._moe_C`` semantics), and ``fused_experts(hidden_states, w1, w2, topk_weights,
topk_ids, inplace=False, activation="silu", expert_map=None)`` of ``vllm.model_executor.layers.
fused_moe`` (unquantised weights only).
"""
import torch

from ..ops import moe as _moe
from ..ops.kvcache import copy_blocks, reshape_and_cache_flash, swap_blocks  # noqa: F401
from ..ops.layernorm import fused_add_rms_norm, rms_norm, silu_and_mul  # noqa: F401
from ..ops.rotary import rotary_embedding  # noqa: F401



def topk_softmax(topk_weights: torch.Tensor, topk_ids: torch.Tensor, token_expert_indices: torch.Tensor,
                 gating_output: torch.Tensor, renormalize: bool = False) -> None:
    """Writes the top-k weights and ids of ``gating_output`` into ``topk_weights`` / ``topk_ids``, and
    ``token_expert_indices[t, j] = j * num_tokens + t`` (vLLM's source-row index)."""
    w, i = _moe.topk_softmax(gating_output, topk_weights.shape[-1] if topk_weights.dim() == 2 else -1, renormalize)
    topk_weights.copy_(w)
    topk_ids.copy_(i)
    T, k = i.shape
    token_expert_indices.copy_(torch.arange(k, device=i.device, dtype=torch.int32)[None, :] * T
                               + torch.arange(T, device=i.device, dtype=torch.int32)[:, None])


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int, sorted_token_ids: torch.Tensor,
                         experts_ids: torch.Tensor, num_tokens_post_pad: torch.Tensor) -> None:
    """vLLM's in-place form: the caller's buffers (at least as long as llmkern's outputs) are filled;
    sorted entries past the used length hold ``topk_ids.numel()``, expert blocks past it -1."""
    s, e, n = _moe.moe_align_block_size(topk_ids, num_experts, block_size)
    for name, dst, src, fill in (("sorted_token_ids", sorted_token_ids, s, topk_ids.numel()),
                                 ("experts_ids", experts_ids, e, -1)):
        if dst.numel() < src.numel():
            raise ValueError(f"{name}: needs at least {src.numel()} entries, got {dst.numel()}")
        dst.fill_(fill)
        dst.view(-1)[:src.numel()].copy_(src)
    num_tokens_post_pad.view(-1)[:1].copy_(n)


def fused_experts(hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, inplace: bool = False, activation: str = "silu",
                  expert_map=None, **unsupported) -> torch.Tensor:
    """vLLM's ``fused_experts`` for unquantised weights (``w1`` = vLLM's stacked gate/up ``w13``)."""
    bad = {k: v for k, v in unsupported.items() if v not in (None, False)}
    if bad:
        raise NotImplementedError(f"{sorted(bad)[0]}: not supported by llmkern's fused_moe (unquantised only)")
    return _moe.fused_moe(hidden_states, w1, w2, topk_weights, topk_ids, activation=activation,
                          expert_map=expert_map, out=hidden_states if inplace else None)


__all__ = ["copy_blocks", "fused_add_rms_norm", "fused_experts", "moe_align_block_size", "topk_softmax", "reshape_and_cache_flash", "rms_norm",
           "rotary_embedding", "silu_and_mul", "swap_blocks"]
