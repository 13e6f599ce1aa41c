"""The one place where the runtime binds to kernels: attention, KV-cache, layer, projection, rotary
and sampling ops.

Everything in the engine and the models calls ``kernels.<op>``; nothing else imports an op."""
from __future__ import annotations

from ..ops.attention import flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: F401
from ..ops.kvcache import copy_blocks, reshape_and_cache_flash, swap_blocks  # noqa: F401
from ..ops.layernorm import fused_add_rms_norm, rms_norm, silu_and_mul  # noqa: F401
from ..ops.linear import linear_packed, linear_small_m, pack_linear_weight, packed_weight_rows  # noqa: F401
from ..ops.rotary import rotary_embedding  # noqa: F401
from ..ops.sampling import (  # noqa: F401
    apply_penalties,
    chain_speculative_sampling,
    min_p_sampling_from_probs,
    sampling_from_probs,
    sampling_from_logits,
    top_k_mask_logits,
    top_k_top_p_sampling_from_logits,
    top_p_renorm_probs,
)


def greedy_tokens(logits):
    """Row argmax (lowest index on ties) as int64: the sampling kernel at temperature 0, a single
    pass on llmkern's threads (5x torch.argmax for 32 x 49k fp32 logits on 2 cores)."""
    return sampling_from_logits(logits, temperature=0.0, seed=0, offset=0).long()
