"""Speculative sampling: verify chains of draft tokens against the target model's probabilities
(FlashInfer signature) -> csrc/sampling/speculative{.cpp,_cpu.cpp,.cu}. Randomness as for the
samplers (:mod:`llmkern.ops.sampling`)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .._backend import dl, kernel_op, lib_for, require_tensor, stream_of
from ._sampling_args import Seed, seed_offset

__all__ = ["chain_speculative_sampling"]


@kernel_op("chain_speculative_sampling", mutates_args=("accepted", "emitted"))
def _chain_spec(
    draft_probs: Optional[torch.Tensor],
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted: torch.Tensor,
    emitted: torch.Tensor,
    seed_arr: Optional[torch.Tensor],
    seed_val: int,
    offset_arr: Optional[torch.Tensor],
    offset_val: int,
    token_bitmask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    b, n1 = target_probs.shape[0], target_probs.shape[1] if target_probs.dim() > 1 else 0
    out = torch.empty(b, n1, dtype=torch.int32, device=target_probs.device)
    lib_for(target_probs).chain_speculative_sampling(
        dl(draft_probs), dl(draft_token_ids), dl(target_probs), dl(out), dl(accepted), dl(emitted),
        dl(seed_arr), seed_val, dl(offset_arr), offset_val, dl(token_bitmask), stream_of(target_probs),
    )
    return out


@_chain_spec.op.register_fake
def _(draft_probs, draft_token_ids, target_probs, accepted, emitted, *args):
    return target_probs.new_empty(target_probs.shape[0], target_probs.shape[1], dtype=torch.int32)


def chain_speculative_sampling(
    draft_probs: Optional[torch.Tensor],
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: Optional[torch.Tensor] = None,
    maybe_output_emitted_draft_token_num: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    seed: Seed = None,
    offset: Seed = None,
    *,
    token_bitmask: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify chains of draft tokens against the target model (speculative sampling).

    ``draft_probs (b, n, V)`` (float32), ``draft_token_ids (b, n)``, ``target_probs (b, n + 1, V)``.
    Draft token ``i`` is accepted when ``u * q < p`` (``u`` uniform in [0, 1), ``q``/``p`` the draft
    and target probabilities of the token); at the first rejection the token is drawn from the
    normalised ``relu(target - draft)`` (from the target row when that has no mass), and the rest
    of the row is ``-1``; when every draft is accepted a bonus token is drawn from
    ``target_probs[:, n]``. The emitted tokens are distributed exactly as the target model's.

    **Drafts without probabilities** (n-gram / prompt-lookup proposers): pass
    ``draft_probs=None``. The draft is then one-hot (``q = 1`` for the proposed token), so token
    ``i`` is accepted with probability ``p(token)`` and a rejection draws from the target row
    without the proposed token — still exact for the target distribution.

    Returns ``(output_token_ids (b, n + 1) int32, accepted_token_num, emitted_draft_token_num)``.
    The two counters (``(b,)``, int32 unless given) are *added to* when passed in:
    ``accepted`` counts positions whose test passes independently of earlier rejections,
    ``emitted`` the draft tokens actually emitted (the bonus / resampled token excluded).
    Randomness: draw ``i`` of request ``r`` at counter ``(offset, r, i)``, see :mod:`llmkern.ops.sampling`.

    ``token_bitmask`` (keyword, llmkern extension): int32 ``(b, n + 1, ceil(V / 32))``, xgrammar's
    packed layout, row ``[r, i]`` the tokens the grammar allows at position ``i`` (after the first
    ``i`` drafts). The target at each position is then its allowed part renormalised, so a
    disallowed draft is always rejected and the resampled / bonus token is drawn from the masked
    target (the verification stays exact for it). A position where nothing allowed has target
    mass emits ``-1`` as its final token."""
    require_tensor(target_probs, "target_probs")
    require_tensor(draft_token_ids, "draft_token_ids")
    if draft_probs is not None:
        require_tensor(draft_probs, "draft_probs")
    if token_bitmask is not None:
        require_tensor(token_bitmask, "token_bitmask")
    b = target_probs.shape[0] if target_probs.dim() > 0 else 0
    dev = target_probs.device
    acc = maybe_output_accepted_token_num
    emi = maybe_output_emitted_draft_token_num
    if acc is None:
        acc = torch.zeros(b, dtype=torch.int32, device=dev)
    else:
        require_tensor(acc, "maybe_output_accepted_token_num")
    if emi is None:
        emi = torch.zeros(b, dtype=torch.int32, device=dev)
    else:
        require_tensor(emi, "maybe_output_emitted_draft_token_num")
    s_arr, s_val, o_arr, o_val = seed_offset(seed, offset, generator, dev)
    out = _chain_spec(draft_probs, draft_token_ids, target_probs, acc, emi, s_arr, s_val, o_arr, o_val,
                      token_bitmask)
    return out, acc, emi


chain_speculative_sampling.op = _chain_spec.op
