"""Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM): GQA, RoPE (+ scaling), optional qkv
bias, tied embeddings, over a paged KV cache.

Lean by construction: token rows of all sequences are one flat [T, hidden] batch; the Q/K/V and
gate/up projections are single fused matmuls; RoPE indexes a precomputed cos/sin table once per
step; norms (fused with the residual add) and the gated SiLU are single llmkern kernels; logits
are computed only for the rows that sample; CPU weights live on huge pages (hugepages.py)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from ..engine import kernels as K
from ..ops.linear import linear_small_m
from .attention import AttnMetadata, paged_attention
from .config import ModelConfig
from .hugepages import move_to_hugepages
from .rope import apply_rope_, cos_sin_table


GEMV_ROWS = 8


def _linear(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor] = None) -> torch.Tensor:
    # Decode steps on CPU are matrix-vector products bound by reading the weights: llmkern's GEMV
    # streams them at the read bandwidth, 2-3x torch's matmul for a few rows. From ~8 rows on the
    # dots, not the stream, are the limit, and torch's blocked GEMM is as fast.
    if x.shape[0] <= GEMV_ROWS and not x.is_cuda and x.stride(-1) == 1:
        return linear_small_m(x, w, b)
    return F.linear(x, w, b)


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor               # [(H + 2 Hkv) * D, hidden]
    qkv_bias: Optional[torch.Tensor]
    o: torch.Tensor                 # [hidden, H * D]
    post_norm: torch.Tensor
    gate_up: torch.Tensor           # [2 * inter, hidden]
    down: torch.Tensor              # [hidden, inter]


class LlamaForCausalLM:
    def __init__(self, config: ModelConfig, embed: torch.Tensor, layers: List[LayerWeights],
                 norm: torch.Tensor, lm_head: torch.Tensor):
        self.config = config
        self.embed = embed
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head
        self.dtype = embed.dtype
        self.device = embed.device
        c = config
        self.scale = c.head_dim ** -0.5
        self.window = (c.sliding_window - 1, 0) if c.sliding_window else (-1, -1)
        self.q_size = c.num_heads * c.head_dim
        self.kv_size = c.num_kv_heads * c.head_dim
        self.cos, self.sin = cos_sin_table(c.head_dim, c.rope_theta, c.rope_scaling,
                                           c.max_position_embeddings, self.dtype, self.device)

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_state_dict(cls, config: ModelConfig, sd: Dict[str, torch.Tensor], dtype: torch.dtype,
                        device) -> "LlamaForCausalLM":
        """Build from HF-named tensors (model.layers.N.self_attn.q_proj.weight, ...), fusing Q/K/V
        and gate/up. Tensors are consumed (popped) to keep peak memory low."""

        def take(name: str, required: bool = True) -> Optional[torch.Tensor]:
            t = sd.pop(name, None)
            if t is None:
                if required:
                    raise ValueError(f"model: weight {name!r} is missing from the checkpoint")
                return None
            return t.to(device=device, dtype=dtype)

        layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            q, k, v = (take(p + f"self_attn.{n}_proj.weight") for n in "qkv")
            bias = None
            if config.qkv_bias:
                bias = torch.cat([take(p + f"self_attn.{n}_proj.bias") for n in "qkv"]).contiguous()
            gate, up = take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")
            layers.append(LayerWeights(
                input_norm=take(p + "input_layernorm.weight"), qkv=torch.cat([q, k, v]).contiguous(),
                qkv_bias=bias, o=take(p + "self_attn.o_proj.weight"),
                post_norm=take(p + "post_attention_layernorm.weight"),
                gate_up=torch.cat([gate, up]).contiguous(), down=take(p + "mlp.down_proj.weight")))
            del q, k, v, gate, up
        embed = take("model.embed_tokens.weight")
        lm_head = embed if config.tie_word_embeddings else take("lm_head.weight", required=False)
        if lm_head is None:  # some checkpoints tie without saying so
            lm_head = embed
        norm = take("model.norm.weight")
        if embed.device.type == "cpu":  # decode streams the weights: keep them on huge pages
            names = [f.name for f in fields(LayerWeights)]
            flat = move_to_hugepages([embed, norm, lm_head] + [getattr(L, n) for L in layers for n in names])
            embed, norm, lm_head = flat[:3]
            layers = [LayerWeights(*flat[3 + i * len(names):3 + (i + 1) * len(names)]) for i in range(len(layers))]
        return cls(config, embed, layers, norm, lm_head)

    @property
    def weight_bytes(self) -> int:
        seen, total = set(), 0
        for t in [self.embed, self.norm, self.lm_head] + [
                w for L in self.layers for w in vars(L).values() if w is not None]:
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total

    # -- forward --------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMetadata,
                kv_caches: List[tuple]) -> torch.Tensor:
        """input_ids/positions [T] -> final hidden states [T, hidden] (before the last norm)."""
        c = self.config
        eps = c.rms_norm_eps
        T = input_ids.shape[0]
        H, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        qk_size = self.q_size + self.kv_size
        hidden = F.embedding(input_ids, self.embed)
        residual = hidden
        hidden = torch.empty_like(residual)
        attn_out = torch.empty((T, H, D), dtype=self.dtype, device=self.device)
        for i, L in enumerate(self.layers):
            if i == 0:
                K.rms_norm(hidden, residual, L.input_norm, eps)
            else:  # residual += previous MLP output; hidden = norm(residual)
                K.fused_add_rms_norm(hidden, residual, L.input_norm, eps)
            qkv = _linear(hidden, L.qkv, L.qkv_bias)
            qk = apply_rope_(qkv[:, :qk_size].view(T, H + Hkv, D), cos, sin)
            v = qkv[:, qk_size:].view(T, Hkv, D)
            k_cache, v_cache = kv_caches[i]
            paged_attention(qk[:, :H], qk[:, H:], v, k_cache, v_cache, meta, self.scale, self.window,
                            attn_out)
            hidden = _linear(attn_out.view(T, H * D), L.o)
            K.fused_add_rms_norm(hidden, residual, L.post_norm, eps)
            gu = _linear(hidden, L.gate_up)
            act = torch.empty((T, gu.shape[-1] // 2), dtype=self.dtype, device=self.device)
            K.silu_and_mul(act, gu)
            hidden = _linear(act, L.down)
        return residual.add_(hidden)

    def compute_logits(self, hidden: torch.Tensor, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Final norm + LM head on the selected rows only; fp32 logits [rows, vocab]."""
        if rows is not None:
            hidden = hidden.index_select(0, rows)
        h = torch.empty_like(hidden)
        K.rms_norm(h, hidden, self.norm, self.config.rms_norm_eps)
        return _linear(h, self.lm_head).float()
