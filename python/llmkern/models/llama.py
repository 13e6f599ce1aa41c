"""Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM): GQA, RoPE (+ scaling), optional qkv
bias, tied embeddings, over a paged KV cache. The mixture-of-experts families are the same decoder
with a MoE MLP (layers/moe.py) in their sparse layers: Mixtral, Qwen2-MoE (shared expert, dense
layers between sparse ones) and Qwen3-MoE (plus RMSNorm on each query/key head before RoPE).

Lean by construction: token rows of all sequences are one flat [T, hidden] batch; the Q/K/V and
gate/up projections are single fused matmuls; RoPE is one in-place kernel on the fused q/k rows;
norms (fused with the residual add) and the gated SiLU are single llmkern kernels; logits
are computed only for the rows that sample; CPU fp32 weights are packed for llmkern's GEMM and live
on huge pages (hugepages.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch

from ..layers.attention import AttnMetadata, paged_attention
from ..layers.embed_head import compute_logits, embed_tokens
from ..layers.layernorm import RMSNorm
from ..layers.linear import GateUpLinear, Linear
from ..layers.moe import MoE, SharedExpert
from ..layers.quant_linear import GGUFWeight, QuantLinear, make_gate_up, make_linear
from ..layers.rotary import RotaryEmbedding
from .config import ModelConfig
from .decode_step import DecoderStep, build_decode_step
from .hugepages import move_to_hugepages
from .moe_weights import moe_layout, stack_experts

_UNBUILT = object()  # a model's C++ decode step before its first forward


@dataclass
class LayerWeights:
    input_norm: RMSNorm
    qkv: Linear                     # [(H + 2 Hkv) * D, hidden], optional bias
    o: Linear                       # [hidden, H * D]
    post_norm: RMSNorm
    gate_up: Optional[GateUpLinear] # hidden -> silu(gate) * up [inter] (None in a sparse layer)
    down: Optional[Linear]          # [hidden, inter]
    moe: Optional[MoE] = None       # a sparse layer's experts
    q_norm: Optional[RMSNorm] = None  # Qwen3: per-head norms of the queries and keys
    k_norm: Optional[RMSNorm] = None


class LlamaForCausalLM:
    def __init__(self, config: ModelConfig, embed: Optional[torch.Tensor], layers: List[LayerWeights],
                 norm: RMSNorm, lm_head: Linear):
        self.config = config
        self.embed = embed
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head
        self.dtype = norm.weight.dtype
        self.device = norm.weight.device
        c = config
        self.scale = c.head_dim ** -0.5
        self.window = (c.sliding_window - 1, 0) if c.sliding_window else (-1, -1)
        self.q_size = c.num_heads * c.head_dim
        self.kv_size = c.num_kv_heads * c.head_dim
        self.rotary = RotaryEmbedding(c.head_dim, c.rope_theta, c.rope_scaling, c.max_position_embeddings,
                                      self.dtype, self.device)
        # Model parallelism (set by llmkern.distributed on a shard of the model; a single-process
        # model keeps these defaults): an in-place sum over the tensor-parallel group after the
        # row-parallel projections and the vocab-parallel embedding, the first vocabulary row
        # this shard holds, and which ends of the layer stack this pipeline stage owns.
        self.tp_reduce: Optional[Callable[[torch.Tensor], None]] = None
        self.vocab_start = 0
        self.is_first_stage = True
        self.is_last_stage = True
        # A sparse layer's MLP: the experts on this process (expert parallelism replaces it with
        # a dispatch of the tokens to the ranks holding their experts).
        self.moe_forward: Callable[[MoE, torch.Tensor], torch.Tensor] = self._moe_local
        # CPU decode-only batches: all layers in one C++ call (decode_step.py), built at the first
        # forward over the weights as they are then; reset_decode_step() after replacing any.
        self._decode_step: Optional[DecoderStep] = _UNBUILT

    def reset_decode_step(self) -> None:
        self._decode_step = _UNBUILT

    def decode_step(self) -> Optional[DecoderStep]:
        """The one-call CPU decode step over this model's layers, or None where it does not apply."""
        if self._decode_step is _UNBUILT:
            self._decode_step = build_decode_step(self)
        return self._decode_step

    def _moe_local(self, moe: MoE, x: torch.Tensor) -> torch.Tensor:
        out = moe(x)
        if self.tp_reduce is not None:  # experts split by their intermediate size: partial sums
            self.tp_reduce(out)
        return out

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
            return t if isinstance(t, GGUFWeight) else t.to(device=device, dtype=dtype)

        eps = config.rms_norm_eps
        layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            q, k, v = (take(p + f"self_attn.{n}_proj.weight") for n in "qkv")
            bias = None
            if config.qkv_bias:
                bias = torch.cat([take(p + f"self_attn.{n}_proj.bias") for n in "qkv"]).contiguous()
            L = LayerWeights(
                input_norm=RMSNorm(take(p + "input_layernorm.weight"), eps),
                qkv=make_linear([q, k, v], bias, dtype, device),
                o=make_linear([take(p + "self_attn.o_proj.weight")], None, dtype, device),
                post_norm=RMSNorm(take(p + "post_attention_layernorm.weight"), eps), gate_up=None, down=None)
            if config.qk_norm:
                L.q_norm = RMSNorm(take(p + "self_attn.q_norm.weight"), eps)
                L.k_norm = RMSNorm(take(p + "self_attn.k_norm.weight"), eps)
            layout = moe_layout(sd, p)
            if layout is None:
                gate, up = take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")
                L.gate_up = make_gate_up(gate, up, dtype, device)
                L.down = make_linear([take(p + "mlp.down_proj.weight")], None, dtype, device)
                del gate, up
            else:
                L.moe = cls._build_moe(config, sd, take, *layout)
            layers.append(L)
            del q, k, v
        embed = take("model.embed_tokens.weight")
        head = None if config.tie_word_embeddings else take("lm_head.weight", required=False)
        # some checkpoints tie without saying so
        lm_head = make_linear([embed if head is None else head], None, dtype, device)
        if head is None and (isinstance(lm_head, QuantLinear) or lm_head.packed):
            embed = None  # tied: look rows up in the packed or quantised head, no second copy
        elif isinstance(embed, GGUFWeight):  # an untied table is only looked up: dense
            embed = embed.dequantize(dtype, device)
        norm = RMSNorm(take("model.norm.weight"), eps)
        model = cls(config, embed, layers, norm, lm_head)
        if model.device.type == "cpu":  # decode streams the weights: keep them on huge pages
            model._move_to_hugepages()
        return model

    @staticmethod
    def _build_moe(config: ModelConfig, sd, take, block: str, names) -> MoE:
        """A sparse layer from its router, its experts (all of them, or the contiguous run an
        expert-parallel rank holds: config.local_experts) and Qwen2-MoE's shared expert."""
        first, count = config.local_experts or (0, config.num_experts)
        w13, w2 = stack_experts(take, block, names, first, count)  # a missing expert: take() names it
        shared = None
        if block + "shared_expert.gate_proj.weight" in sd:
            s = block + "shared_expert."
            shared = SharedExpert(
                GateUpLinear(take(s + "gate_proj.weight"), take(s + "up_proj.weight")),
                Linear(take(s + "down_proj.weight")), Linear(take(block + "shared_expert_gate.weight")))
        return MoE(Linear(take(block + "gate.weight")), w13, w2, config.num_experts_per_tok, config.norm_topk_prob,
                   config.num_experts, first, shared)

    def _linears(self) -> List[Linear]:
        out = [self.lm_head] + [getattr(L, n) for L in self.layers for n in ("qkv", "o")]
        for L in self.layers:
            if L.moe is None:
                out += [L.gate_up, L.down]
            else:
                out.append(L.moe.router)
                if L.moe.shared is not None:
                    out += [L.moe.shared.gate_up, L.moe.shared.down, L.moe.shared.gate]
        return out

    def _norms(self) -> List[RMSNorm]:
        out = [self.norm] + [n for L in self.layers for n in (L.input_norm, L.post_norm)]
        return out + [n for L in self.layers for n in (L.q_norm, L.k_norm) if n is not None]

    def _tensors(self) -> List[Optional[torch.Tensor]]:
        """Every weight tensor, in a fixed order (tied ones repeated)."""
        out = [self.embed] + [n.weight for n in self._norms()]
        out += [t for lin in self._linears() for t in lin.tensors()]
        return out + [t for L in self.layers if L.moe is not None for t in L.moe.expert_tensors()]

    def _move_to_hugepages(self) -> None:
        self.reset_decode_step()
        it = iter(move_to_hugepages(self._tensors()))
        self.embed = next(it)
        for n in self._norms():
            n.weight = next(it)
        for lin in self._linears():
            lin.set_tensors([next(it) for _ in lin.tensors()])
        for L in self.layers:
            if L.moe is not None:
                L.moe.set_expert_tensors([next(it) for _ in L.moe.expert_tensors()])

    @property
    def weight_bytes(self) -> int:
        seen, total = set(), 0
        for t in self._tensors():
            if t is not None and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total

    # -- forward --------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMetadata,
                kv_caches: List[tuple], intermediate: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
                ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """input_ids/positions [T] -> final hidden states [T, hidden], after the final norm.

        A pipeline stage that is not the first takes the previous stage's (hidden, residual) as
        `intermediate`; one that is not the last returns its own (hidden, residual) instead."""
        c = self.config
        T = input_ids.shape[0]
        H, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        reduce = self.tp_reduce
        if intermediate is None:
            residual = embed_tokens(input_ids, self.embed, self.lm_head, self.vocab_start,
                                    None if reduce is None else c.vocab_size)
            if reduce is not None:
                reduce(residual)
            hidden = torch.empty_like(residual)
            if reduce is None and self.is_last_stage:
                step = self.decode_step()
                if step is not None and step.accepts(T, meta):  # every layer in one C++ call
                    step(hidden, residual, meta, kv_caches)
                    self.norm.add_(hidden, residual)
                    return hidden
        else:
            hidden, residual = intermediate
        attn_out = torch.empty((T, H, D), dtype=self.dtype, device=self.device)
        attn_rows = attn_out.view(T, H * D)  # the o projection's input, one view for all layers
        for i, L in enumerate(self.layers):
            if i == 0 and intermediate is None:
                L.input_norm(residual, out=hidden)
            else:  # residual += previous MLP output; hidden = norm(residual)
                L.input_norm.add_(hidden, residual)
            qkv = L.qkv(hidden).view(T, -1, D)  # heads: H query, Hkv key, Hkv value
            q, k, v = qkv[:, :H], qkv[:, H:H + Hkv], qkv[:, H + Hkv:]
            if L.q_norm is not None:  # per-head norms need each head's row on its own: copies
                q, k = q.contiguous(), k.contiguous()
                L.q_norm(q.view(-1, D), out=q.view(-1, D))
                L.k_norm(k.view(-1, D), out=k.view(-1, D))
            k_cache, v_cache = kv_caches[i]
            paged_attention(q, k, v, k_cache, v_cache, meta, self.scale, self.window, attn_out, self.rotary,
                            positions)
            hidden = L.o(attn_rows)
            if reduce is not None:  # row-parallel o_proj: partial sums over the head shards
                reduce(hidden)
            L.post_norm.add_(hidden, residual)
            if L.moe is not None:
                hidden = self.moe_forward(L.moe, hidden)
                continue
            hidden = L.down(L.gate_up(hidden))
            if reduce is not None:  # row-parallel down_proj
                reduce(hidden)
        if not self.is_last_stage:
            return hidden, residual
        self.norm.add_(hidden, residual)  # one pass: last residual add + final norm
        return hidden

    def compute_logits(self, hidden: torch.Tensor, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """LM head on the selected rows of forward()'s output only; fp32 logits [rows, vocab]."""
        return compute_logits(self.lm_head, hidden, rows)

