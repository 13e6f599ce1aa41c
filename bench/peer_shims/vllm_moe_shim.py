"""The vLLM Python around its MoE ops that tests/kernels/moe/test_moe_align_block_size.py and
test_fused_topk.py import, written from vLLM's documented behaviour on top of
llmkern.compat.vllm_ops: the moe_align_block_size wrappers (buffer sizes as vLLM allocates
them) and the fused_topk / fused_topk_bias routers."""
from __future__ import annotations

import torch


def round_up(x: int, y: int) -> int:
    return (x + y - 1) // y * y


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def moe_align_block_size(topk_ids, block_size, num_experts, expert_map=None, pad_sorted_ids=False,
                         ignore_invalid_experts=False):
    from llmkern.compat import vllm_ops as ops

    max_padded = topk_ids.numel() + num_experts * (block_size - 1)
    if pad_sorted_ids:
        max_padded = round_up(max_padded, block_size)
    dev = topk_ids.device
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(cdiv(max_padded, block_size), dtype=torch.int32, device=dev)
    num_post_pad = torch.empty(1, dtype=torch.int32, device=dev)
    ops.moe_align_block_size(topk_ids, num_experts, block_size, sorted_ids, expert_ids, num_post_pad,
                             expert_map if ignore_invalid_experts else None)
    if expert_map is not None and not ignore_invalid_experts:
        expert_ids = expert_map[expert_ids]
    return sorted_ids, expert_ids, num_post_pad


def batched_moe_align_block_size(max_tokens_per_batch, block_size, expert_num_tokens):
    from llmkern.compat import vllm_ops as ops

    dev = expert_num_tokens.device
    max_padded = expert_num_tokens.size(0) * round_up(max_tokens_per_batch, block_size)
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(max_padded // block_size, dtype=torch.int32, device=dev)
    num_post_pad = torch.empty(1, dtype=torch.int32, device=dev)
    ops.batched_moe_align_block_size(max_tokens_per_batch, block_size, expert_num_tokens, sorted_ids,
                                     expert_ids, num_post_pad)
    return sorted_ids, expert_ids, num_post_pad


def _route(gating_output, topk, renormalize, scoring_func, bias=None, indices_type=None):
    from llmkern.compat import vllm_ops as ops

    T = gating_output.shape[0]
    dev = gating_output.device
    w = torch.empty(T, topk, dtype=torch.float32, device=dev)
    ids = torch.empty(T, topk, dtype=torch.int32 if indices_type is None else indices_type, device=dev)
    tei = torch.empty(T, topk, dtype=torch.int32, device=dev)
    fn = {"softmax": ops.topk_softmax, "sigmoid": ops.topk_sigmoid}[scoring_func]
    fn(w, ids, tei, gating_output, renormalize, bias)
    return w, ids, tei


def fused_topk(hidden_states, gating_output, topk, renormalize, indices_type=None, scoring_func="softmax"):
    return _route(gating_output, topk, renormalize, scoring_func, None, indices_type)


def fused_topk_bias(hidden_states, gating_output, e_score_correction_bias, topk, renormalize,
                    scoring_func="softmax", indices_type=None, **_):
    w, ids, _tei = _route(gating_output, topk, renormalize, scoring_func, e_score_correction_bias, indices_type)
    return w, ids


def install(module) -> None:
    """Registers the modules with ``module(name, **attrs)`` (vllm_shim's helper)."""
    fm = "vllm.model_executor.layers.fused_moe"
    module(f"{fm}.moe_align_block_size", moe_align_block_size=moe_align_block_size,
           batched_moe_align_block_size=batched_moe_align_block_size)
    module(f"{fm}.router.fused_topk_router", fused_topk=fused_topk)
    module(f"{fm}.router.fused_topk_bias_router", fused_topk_bias=fused_topk_bias)
    module(f"{fm}.fused_moe", fused_topk=fused_topk)
    module("vllm.utils", round_up=round_up, cdiv=cdiv)
    module("vllm.utils.math_utils", round_up=round_up, cdiv=cdiv)
