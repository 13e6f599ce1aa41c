"""vLLM's MoE routing and alignment ops (``vllm._moe_C`` through ``_custom_ops``, the signatures
of vLLM's late-2026 main branch) in their in-place form: the caller's output buffers are filled.

Plain softmax routing runs llmkern's kernel; the extensions vLLM added since (a score-correction
bias for choosing experts, sigmoid scoring, a routed scaling factor, padding rows) run in torch,
with vLLM's rules: scores in fp32, NaN / inf scores count as 0 (a poisoned row still gets
distinct experts and finite weights; on CUDA only off the plain path), experts chosen on
``score + bias`` but weighted by the unbiased score, renormalised rows scaled by
``routed_scaling_factor``, and padding rows given weight 0 and expert id ``num_experts``."""
from __future__ import annotations

from typing import Optional

import torch

from .._args import int_arg, require_tensor
from ..ops import moe as _moe


def _source_rows(token_expert_indices: torch.Tensor, T: int, k: int, device) -> None:
    """``token_expert_indices[t, j] = j * T + t``: each (token, slot)'s row in vLLM's permuted order."""
    token_expert_indices.copy_(torch.arange(k, device=device, dtype=torch.int32)[None, :] * T
                               + torch.arange(T, device=device, dtype=torch.int32)[:, None])


def _route(topk_weights, topk_ids, token_expert_indices, gating_output, renormalize, bias, scale,
           is_padding, scoring: str) -> None:
    require_tensor(gating_output, "gating_output", 2, "[num_tokens, num_experts]")
    T, E = gating_output.shape
    k = topk_weights.shape[-1]
    plain = bias is None and is_padding is None and scale == 1.0 and scoring == "softmax"
    # Poisoned rows take the torch path; the check reads the host only for CPU tensors (on CUDA
    # it would synchronise, so there the kernel's own handling of NaN / inf applies).
    if plain and (gating_output.is_cuda or bool(torch.isfinite(gating_output).all())):
        w, i = _moe.topk_softmax(gating_output, k, bool(renormalize))
    else:
        g = gating_output.float()
        s = torch.softmax(g, dim=-1) if scoring == "softmax" else torch.sigmoid(g)
        s = torch.where(torch.isfinite(s), s, torch.zeros_like(s))
        choice = s if bias is None else s + bias.float()[None, :]
        # Ties: the lower expert id first, as the kernel (torch.topk's CPU order is the reverse).
        i = torch.sort(choice, dim=-1, descending=True, stable=True)[1][:, :k]
        w = s.gather(1, i)
        if renormalize:
            total = w.sum(dim=-1, keepdim=True)
            w = w / torch.where(total > 0, total, torch.ones_like(total))
        w = w * float(scale)
        if is_padding is not None:
            pad = is_padding.reshape(-1).bool()[:, None]
            w = torch.where(pad, torch.zeros_like(w), w)
            i = torch.where(pad, torch.full_like(i, E), i)
    topk_weights.copy_(w)
    topk_ids.copy_(i)
    _source_rows(token_expert_indices, T, k, gating_output.device)


def topk_softmax(topk_weights: torch.Tensor, topk_ids: torch.Tensor, token_expert_indices: torch.Tensor,
                 gating_output: torch.Tensor, renormalize: bool = False,
                 e_score_correction_bias: Optional[torch.Tensor] = None,
                 is_padding: Optional[torch.Tensor] = None) -> None:
    """Softmax routing: the top-k weights / ids of ``gating_output`` into the caller's buffers, and
    ``token_expert_indices[t, j] = j * num_tokens + t`` (vLLM's source-row index)."""
    _route(topk_weights, topk_ids, token_expert_indices, gating_output, renormalize, e_score_correction_bias,
           1.0, is_padding, "softmax")


def topk_sigmoid(topk_weights: torch.Tensor, topk_ids: torch.Tensor, token_expert_indices: torch.Tensor,
                 gating_output: torch.Tensor, renormalize: bool = False,
                 e_score_correction_bias: Optional[torch.Tensor] = None, routed_scaling_factor: float = 1.0,
                 is_padding: Optional[torch.Tensor] = None) -> None:
    """Sigmoid routing (DeepSeek-V3 style), otherwise as :func:`topk_softmax`."""
    _route(topk_weights, topk_ids, token_expert_indices, gating_output, renormalize, e_score_correction_bias,
           routed_scaling_factor, is_padding, "sigmoid")


def _fill(dst: torch.Tensor, src: torch.Tensor, fill: int) -> None:
    """The caller's buffer: ``fill`` everywhere, then llmkern's output over its start. Only the
    used part must fit (vLLM sizes its buffers for the worst case, llmkern for its own); what
    does not fit is padding."""
    dst.fill_(fill)
    n = min(dst.numel(), src.numel())
    dst.view(-1)[:n].copy_(src.reshape(-1)[:n])


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int, sorted_token_ids: torch.Tensor,
                         experts_ids: torch.Tensor, num_tokens_post_pad: torch.Tensor,
                         expert_map: Optional[torch.Tensor] = None) -> None:
    """vLLM's in-place form: the caller's buffers (long enough for the used part) are filled;
    sorted entries past the used length hold ``topk_ids.numel()`` and expert blocks past it 0
    (vLLM's values). With ``expert_map`` (vLLM's "ignore invalid experts"), pairs whose expert
    maps to -1 are left out and the blocks carry local expert ids."""
    ids = topk_ids
    if expert_map is not None:
        require_tensor(expert_map, "expert_map", 1, "[num_experts]")
        ids = torch.where(topk_ids >= 0, expert_map.to(topk_ids.device).long()[topk_ids.long().clamp(min=0)], -1)
        ids = ids.to(torch.int32)
    s, e, n = _moe.moe_align_block_size(ids, num_experts, block_size)
    _fill(sorted_token_ids, s, topk_ids.numel())
    _fill(experts_ids, e.clamp(min=0), 0)
    num_tokens_post_pad.view(-1)[:1].copy_(n)


def batched_moe_align_block_size(max_tokens_per_batch: int, block_size: int, expert_num_tokens: torch.Tensor,
                                 sorted_ids: torch.Tensor, expert_ids: torch.Tensor,
                                 num_tokens_post_pad: torch.Tensor) -> None:
    """The batched-experts layout: expert e's tokens are rows ``e * max_tokens_per_batch + j``
    for ``j < expert_num_tokens[e]``; each expert's run is padded to ``block_size``. Unused
    sorted entries hold ``E * max_tokens_per_batch``, unused blocks -1 (vLLM's values)."""
    m = int_arg(max_tokens_per_batch, "max_tokens_per_batch", 0)
    bs = int_arg(block_size, "block_size", 1)
    counts = expert_num_tokens.to(sorted_ids.device).long().reshape(-1)
    E = counts.numel()
    padded = (counts + bs - 1) // bs * bs
    starts = torch.cumsum(padded, 0) - padded
    total = int(padded.sum())
    if total > sorted_ids.numel():
        raise ValueError(f"sorted_ids: needs at least {total} entries, got {sorted_ids.numel()}")
    sorted_ids.fill_(E * m)
    expert_ids.fill_(-1)
    e = torch.repeat_interleave(torch.arange(E, device=sorted_ids.device), counts)
    j = torch.arange(e.numel(), device=sorted_ids.device) - (torch.cumsum(counts, 0) - counts)[e]
    sorted_ids.view(-1)[starts[e] + j] = (e * m + j).to(sorted_ids.dtype)
    blocks = padded // bs
    be = torch.repeat_interleave(torch.arange(E, device=sorted_ids.device), blocks)
    expert_ids.view(-1)[:be.numel()] = be.to(expert_ids.dtype)
    num_tokens_post_pad.view(-1)[:1].fill_(total)
