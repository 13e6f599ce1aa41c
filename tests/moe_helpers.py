"""Tiny random transformers MoE checkpoints (Mixtral, Qwen2-MoE, Qwen3-MoE) for the model and
expert-parallel tests."""
from __future__ import annotations

import torch

COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=256, max_position_embeddings=256, initializer_range=0.1, bos_token_id=1, eos_token_id=2)
# top-k 2 of 8 (Mixtral), 4 of 6 with a shared expert and a dense layer (Qwen2-MoE), 2 of 6 with
# renormalised weights, every second layer sparse (Qwen3-MoE)
FAMILIES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=8, num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(num_experts=6, num_experts_per_tok=4, moe_intermediate_size=40,
                       shared_expert_intermediate_size=72, mlp_only_layers=[1], norm_topk_prob=False)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=40, head_dim=16,
                       decoder_sparse_step=2, norm_topk_prob=True)),
}


def tiny_moe_model(path: str, family: str, seed: int = 0, **overrides):
    """Save a tiny random transformers MoE model to `path`; returns it (fp32, eval)."""
    import transformers

    cfg_cls, model_cls, kw = FAMILIES[family]
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_cls)(**{**COMMON, **kw, **overrides})
    model = getattr(transformers, model_cls)(cfg).eval()
    model.save_pretrained(path)
    return model
