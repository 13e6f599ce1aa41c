"""A sampled request's filters (temperature, top-k, top-p of the top-k set, min-p) as per-row
kernel arguments, and the distribution they leave. Written once for the sampler, which draws with
the fused kernels, and for speculative decoding, which needs the distribution itself (the draft's
and the target's) for the verification."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..ops.sampling import softmax, top_k_mask_logits, top_k_renorm_probs, top_p_renorm_probs
from .sampling_params import SamplingParams


@dataclass(frozen=True)
class RowFilters:
    """Filters of R rows as the sampling kernels take them; use_*: some row applies that filter."""
    temperature: torch.Tensor  # fp32 (R,); 0 = greedy (softmax gives the one-hot of the argmax)
    top_k: torch.Tensor        # int32 (R,), clamped to the vocabulary as vLLM does (V = off)
    top_p: torch.Tensor        # fp32 (R,), 1 = off
    min_p: torch.Tensor        # fp32 (R,), 0 = off
    use_top_k: bool
    use_top_p: bool
    use_min_p: bool

    @classmethod
    def of(cls, params: Sequence[SamplingParams], logits: torch.Tensor) -> "RowFilters":
        """The filters of `params[i]` for row i of `logits` [R, V]."""
        V, dev = logits.shape[1], logits.device
        top_k = [min(p.top_k, V) if p.top_k > 0 else V for p in params]
        top_p = [p.top_p for p in params]
        min_p = [p.min_p for p in params]
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev),
            top_k=torch.tensor(top_k, dtype=torch.int32, device=dev),
            top_p=torch.tensor(top_p, dtype=torch.float32, device=dev),
            min_p=torch.tensor(min_p, dtype=torch.float32, device=dev),
            use_top_k=any(k < V for k in top_k), use_top_p=any(q < 1.0 for q in top_p),
            use_min_p=any(m > 0 for m in min_p))


def filtered_probs(logits: torch.Tensor, f: RowFilters, *, min_p: bool = True,
                   token_bitmask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """fp32 probabilities [R, V]: softmax(logits / T) restricted to each row's top-k set, then to
    its top-p set (of the top-k set renormalised), then to its min-p set, renormalised: the
    distribution the sampler draws from. min_p=False stops before min-p, for the draw kernel
    (min_p_sampling_from_probs) that applies the same rule as it draws. token_bitmask (int32
    [R, ceil(V / 32)]): the grammar mask, applied first (the filters act on the allowed tokens)."""
    if token_bitmask is not None:
        # The mask is fused into the softmax; top-k then acts on the masked probabilities (the
        # same order as on the logits).
        probs = softmax(logits, f.temperature, token_bitmask=token_bitmask)
        if f.use_top_k:
            probs = top_k_renorm_probs(probs, f.top_k)
    else:
        # Top-k of the logits is top-k of logits / T (T > 0 keeps the order); softmax divides by T.
        x = top_k_mask_logits(logits, f.top_k) if f.use_top_k else logits
        probs = softmax(x, f.temperature)
    if f.use_top_p:
        probs = top_p_renorm_probs(probs, f.top_p)
    if min_p and f.use_min_p:
        # No op keeps a min-p set without drawing; the rule is min_p_sampling_from_probs':
        # w >= min_p * max(w).
        keep = probs >= f.min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
        probs = torch.where(keep, probs, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs.contiguous()
