"""Plain-torch references the kernel tests compare against (fp32 upcast, no llmkern code).

Sections: KV cache, attention, sampling. Each reference is written from the semantics in the
peer project's documentation, independently of the kernels.
"""
from __future__ import annotations

import torch

# ---------------------------------------------------------------------------------------------
# KV cache (vLLM semantics)
# ---------------------------------------------------------------------------------------------


def ref_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping):
    """Returns new caches: cache.view(-1, H, D)[slot] = key[token] for slots >= 0."""
    kc, vc = key_cache.clone(), value_cache.clone()
    nb, bs, h, d = kc.shape
    n = slot_mapping.shape[0]
    slots = slot_mapping.long()
    keep = slots >= 0
    idx = slots[keep]
    kc.view(nb * bs, h, d)[idx] = key[:n][keep]
    vc.view(nb * bs, h, d)[idx] = value[:n][keep]
    return kc, vc


def ref_copy_blocks(key_caches, value_caches, block_mapping):
    out_k = [c.clone() for c in key_caches]
    out_v = [c.clone() for c in value_caches]
    for src, dst in block_mapping.tolist():
        for ck, cv in zip(out_k, out_v):
            ck[dst] = ck[src].clone()
            cv[dst] = cv[src].clone()
    return out_k, out_v


# ---------------------------------------------------------------------------------------------
# Attention (flash-attn 2 semantics)
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Sampling (FlashInfer semantics)
# ---------------------------------------------------------------------------------------------
