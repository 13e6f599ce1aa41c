"""llmkern.compat.vllm_ops against vLLM's documented ``_custom_ops`` behaviour: the names and
parameter order, rotary_embedding on every query/key layout vLLM passes ([batch, seq] positions,
flat or per-head rows, padded heads sliced to head_size, no key), copy_blocks on vLLM's older
5-D key / 4-D value cache layout, reshape_and_cache_flash into HND-ordered (strided) caches.
References are plain torch."""
from __future__ import annotations

import inspect

import pytest
import torch

from llmkern.compat import vllm_ops as ops
from llmkern.layers.rotary import cos_sin_cache
from reference import ref_copy_blocks

VLLM_PARAMS = {
    "reshape_and_cache_flash": ["key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype",
                                "k_scale", "v_scale"],
    "copy_blocks": ["key_caches", "value_caches", "block_mapping"],
    "swap_blocks": ["src", "dst", "block_size_in_bytes", "block_mapping"],
    "reshape_and_cache": ["key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype",
                          "k_scale", "v_scale"],
    "topk_softmax": ["topk_weights", "topk_ids", "token_expert_indices", "gating_output", "renormalize",
                     "e_score_correction_bias", "is_padding"],
    "topk_sigmoid": ["topk_weights", "topk_ids", "token_expert_indices", "gating_output", "renormalize",
                     "e_score_correction_bias", "routed_scaling_factor", "is_padding"],
    "moe_align_block_size": ["topk_ids", "num_experts", "block_size", "sorted_token_ids", "experts_ids",
                             "num_tokens_post_pad", "expert_map"],
    "batched_moe_align_block_size": ["max_tokens_per_batch", "block_size", "expert_num_tokens", "sorted_ids",
                                     "expert_ids", "num_tokens_post_pad"],
    "rms_norm": ["out", "input", "weight", "epsilon"],
    "fused_add_rms_norm": ["input", "residual", "weight", "epsilon"],
    "rotary_embedding": ["positions", "query", "key", "head_size", "cos_sin_cache", "is_neox"],
    "silu_and_mul": ["out", "input"],
}


@pytest.mark.parametrize("name", sorted(VLLM_PARAMS))
def test_names_and_parameters(name):
    assert list(inspect.signature(getattr(ops, name)).parameters) == VLLM_PARAMS[name]


def _ref_rope(x, pos, cache, head_size, neox):
    """x [..., H, head_size], positions with x's leading shape; computed in x's dtype, every
    product and sum rounded there (vLLM's kernel and reference)."""
    xf = x.clone()
    rot = cache.shape[1]
    c = cache.to(x.dtype)[pos.long()][..., None, : rot // 2]
    s = cache.to(x.dtype)[pos.long()][..., None, rot // 2:]
    if neox:
        a, b = xf[..., : rot // 2].clone(), xf[..., rot // 2: rot].clone()
        xf[..., : rot // 2], xf[..., rot // 2: rot] = a * c - b * s, b * c + a * s
    else:
        a, b = xf[..., 0:rot:2].clone(), xf[..., 1:rot:2].clone()
        xf[..., 0:rot:2], xf[..., 1:rot:2] = a * c - b * s, b * c + a * s
    return xf


@pytest.mark.parametrize("layout", ["flat", "heads", "padded_heads"])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("use_key", [True, False])
def test_rotary_embedding_vllm_layouts(backend, layout, neox, use_key):
    torch.manual_seed(0)
    b, s, h, d, rot = 2, 5, 3, 80, 32
    dtype = torch.float16
    cache = cos_sin_cache(rot, 10000.0, None, 64, dtype, "cpu")
    pos = torch.randint(0, 64, (b, s))
    if layout == "padded_heads":
        q = torch.randn(b, s, h, d + 64).to(dtype)[..., :d]
    else:
        q = torch.randn(b, s, h, d).to(dtype)
    k = torch.randn_like(q) if use_key else None
    ref_q = _ref_rope(q, pos, cache, d, neox)
    ref_k = _ref_rope(k, pos, cache, d, neox) if use_key else None
    qa = q.reshape(b, s, h * d) if layout == "flat" else q
    ka = (k.reshape(b, s, h * d) if layout == "flat" else k) if use_key else None
    ops.rotary_embedding(pos, qa, ka, d, cache, neox)
    assert torch.equal(qa.reshape(b, s, h, d), ref_q)
    if use_key:
        assert torch.equal(ka.reshape(b, s, h, d), ref_k)


def test_copy_blocks_older_paged_layout(backend):
    torch.manual_seed(1)
    nb, h, d, bs, x = 12, 2, 32, 4, 8
    keys = [torch.randn(nb, h, d // x, bs, x).half() for _ in range(2)]
    values = [torch.randn(nb, h, d, bs).half() for _ in range(2)]
    mapping = torch.tensor([[1, 5], [1, 6], [3, 9]])
    rk, rv = ref_copy_blocks(keys, values, mapping)
    ops.copy_blocks(keys, values, mapping)
    for a, r in zip(keys + values, rk + rv):
        assert torch.equal(a, r)
    with pytest.raises(ValueError, match="value_caches"):
        ops.copy_blocks(keys[:1], [torch.randn(nb, h, d, bs + 1).half()], mapping)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_reshape_and_cache_flash_strided_caches(backend, layout):
    torch.manual_seed(2)
    nb, bs, h, d = 8, 4, 2, 32
    order = (0, 1, 2, 3, 4) if layout == "NHD" else (0, 1, 3, 2, 4)
    generic = (nb, 2, bs, h, d)
    kv = torch.randn(*[generic[i] for i in order]).permute(*[order.index(i) for i in range(5)])
    kc, vc = kv[:, 0], kv[:, 1]
    key, value = torch.randn(6, h, d), torch.randn(6, h, d)
    slots = torch.tensor([0, 5, 9, 17, 30, 31])
    rk, rv = kc.clone(), vc.clone()
    for i, sl in enumerate(slots.tolist()):
        rk[sl // bs, sl % bs], rv[sl // bs, sl % bs] = key[i], value[i]
    ops.reshape_and_cache_flash(key, value, kc, vc, slots, "auto", torch.tensor(1.0), torch.tensor(1.0))
    assert torch.equal(kc, rk) and torch.equal(vc, rv)
