"""A rank's slice of a HF-named Llama checkpoint, expressed as a smaller Llama of the same family
(fewer heads, a narrower MLP, a slice of the vocabulary, a range of layers), so the ordinary model
code runs it and only the reductions are added (models/llama.py: tp_reduce).

Megatron-style split over T ranks:
- q/k/v (and Qwen2's biases): column-parallel by heads. With Hkv >= T every rank takes a
  contiguous run of KV heads (Hkv/T each, or, when T does not divide Hkv, runs differing by one:
  SmolLM2's 3 KV heads over 2 ranks are 2 + 1) and the query heads that read them; with Hkv < T
  (T a multiple of Hkv) a rank takes H/T query heads and the one KV head they read, replicated
  on T/Hkv ranks.
- o_proj, down_proj: row-parallel (their input columns split the same way); the partial sums are
  all-reduced.
- gate/up: column-parallel over the intermediate size.
- embedding and LM head: vocab-parallel over V padded to a multiple of T (padding rows are zero
  and their logits are cut off after the gather).
- sparse (MoE) layers: the router (and Qwen3's per-head q/k norm weights) on every rank. Without
  expert parallelism each expert and the shared expert are split like the dense MLP (gate/up rows,
  down columns: partial sums, all-reduced); with it (topo.ep == T) rank r holds experts
  [r E/T, (r+1) E/T) whole and a whole copy of the shared expert (expert_parallel.py)."""
from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

import torch

from ..models.config import ModelConfig
from ..models.moe_weights import expert_weight, moe_layout
from .topology import Topology


def check_parallel(cfg: ModelConfig, topo: Topology) -> None:
    """Clear errors for layouts the model cannot be split into."""
    T, P = topo.tp, topo.pp
    if cfg.num_kv_heads < T and (T % cfg.num_kv_heads or cfg.num_heads % T):
        raise ValueError(f"tensor_parallel_size: {T} is more than the model's {cfg.num_kv_heads} KV heads, so it "
                         f"must be a multiple of them and divide the {cfg.num_heads} attention heads")
    if cfg.intermediate_size % T:
        raise ValueError(f"tensor_parallel_size: {T} does not divide the intermediate size {cfg.intermediate_size}")
    if P > cfg.num_layers:
        raise ValueError(f"pipeline_parallel_size: {P} is more than the model's {cfg.num_layers} layers")
    if topo.ep > 1 and not cfg.num_experts:
        raise ValueError(f"expert_parallel_size: {topo.ep}, but the model ({cfg.arch}) has no experts")
    if topo.ep > 1 and cfg.num_experts % topo.ep:
        raise ValueError(f"expert_parallel_size: {topo.ep} does not divide the model's {cfg.num_experts} experts")
    if cfg.num_experts and topo.ep == 1:
        for name in ("moe_intermediate_size", "shared_expert_intermediate_size"):
            if getattr(cfg, name) % T:
                raise ValueError(f"tensor_parallel_size: {T} does not divide the {name} {getattr(cfg, name)} "
                                 f"(or spread the experts instead: expert_parallel_size={T})")


def padded_vocab(vocab: int, tp: int) -> int:
    return -(-vocab // tp) * tp


def head_split(cfg: ModelConfig, tp: int, r: int) -> Tuple[int, int, int, int]:
    """(first query head, query heads, first KV head, KV heads) of tensor-parallel rank r; rank 0
    holds the most."""
    H, Hkv = cfg.num_heads, cfg.num_kv_heads
    if Hkv >= tp:
        base, extra = divmod(Hkv, tp)
        kv0, hkv = r * base + min(r, extra), base + (1 if r < extra else 0)
        group = H // Hkv
        return kv0 * group, hkv * group, kv0, hkv
    hq = H // tp  # replicated: the KV head that query heads [r hq, (r+1) hq) read
    return r * hq, hq, r * Hkv // tp, 1


def local_config(cfg: ModelConfig, topo: Topology, rank: int) -> Tuple[ModelConfig, int]:
    """(the config of rank's shard, the first vocabulary row it holds)."""
    T = topo.tp
    first, end = topo.layers(topo.stage_of(rank))
    vshard = padded_vocab(cfg.vocab_size, T) // T
    _, hq, _, hkv = head_split(cfg, T, topo.tp_rank_of(rank))
    split_experts = T if topo.ep == 1 else 1  # expert parallelism keeps experts whole
    per = cfg.num_experts // topo.ep
    held = (topo.tp_rank_of(rank) * per, per) if topo.ep > 1 else None
    local = dataclasses.replace(
        cfg, num_heads=hq, num_kv_heads=hkv,
        intermediate_size=cfg.intermediate_size // T, vocab_size=vshard, num_layers=end - first,
        moe_intermediate_size=cfg.moe_intermediate_size // split_experts,
        shared_expert_intermediate_size=cfg.shared_expert_intermediate_size // split_experts, local_experts=held,
        # the shard's layers are renumbered from 0: spell its dense layers out instead of a step
        decoder_sparse_step=1, mlp_only_layers=[j for j in range(end - first) if not cfg.is_moe_layer(first + j)])
    return local, topo.tp_rank_of(rank) * vshard


def shard_state_dict(cfg: ModelConfig, sd: Dict[str, torch.Tensor], topo: Topology, rank: int
                     ) -> Dict[str, torch.Tensor]:
    """rank's HF-named tensors (layers renumbered from 0), taken from the full state dict."""
    T, r = topo.tp, topo.tp_rank_of(rank)
    D = cfg.head_dim
    q0, hq, kv0, hkv = head_split(cfg, T, r)
    inter = cfg.intermediate_size // T
    vpad = padded_vocab(cfg.vocab_size, T)
    vshard = vpad // T

    def rows(t: torch.Tensor, start: int, n: int) -> torch.Tensor:
        return t[start:start + n].clone()

    def cols(t: torch.Tensor, start: int, n: int) -> torch.Tensor:
        return t[:, start:start + n].clone()

    def vocab_rows(t: torch.Tensor) -> torch.Tensor:
        if vpad != t.shape[0]:
            t = torch.cat([t, t.new_zeros((vpad - t.shape[0],) + tuple(t.shape[1:]))])
        return rows(t, r * vshard, vshard)

    out: Dict[str, torch.Tensor] = {}
    first, end = topo.layers(topo.stage_of(rank))
    for i in range(first, end):
        p, q = f"model.layers.{i}.", f"model.layers.{i - first}."
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
                     "self_attn.k_norm.weight"):
            if p + name in sd:
                out[q + name] = sd[p + name]
        for kind in ("weight", "bias"):
            if p + f"self_attn.q_proj.{kind}" not in sd:
                continue
            out[q + f"self_attn.q_proj.{kind}"] = rows(sd[p + f"self_attn.q_proj.{kind}"], q0 * D, hq * D)
            for n in "kv":
                out[q + f"self_attn.{n}_proj.{kind}"] = rows(sd[p + f"self_attn.{n}_proj.{kind}"], kv0 * D, hkv * D)
        out[q + "self_attn.o_proj.weight"] = cols(sd[p + "self_attn.o_proj.weight"], q0 * D, hq * D)
        layout = moe_layout(sd, p)
        if layout is not None:
            _shard_moe(cfg, sd, out, topo, r, p, q, *layout)
            continue
        for n in ("gate_proj", "up_proj"):
            out[q + f"mlp.{n}.weight"] = rows(sd[p + f"mlp.{n}.weight"], r * inter, inter)
        out[q + "mlp.down_proj.weight"] = cols(sd[p + "mlp.down_proj.weight"], r * inter, inter)
    # Every stage keeps the (vocab-sharded) embedding, head and final norm: the model code needs
    # them to be present, and they are small next to the layers of the models this targets.
    out["model.embed_tokens.weight"] = vocab_rows(sd["model.embed_tokens.weight"])
    if "lm_head.weight" in sd and not cfg.tie_word_embeddings:
        out["lm_head.weight"] = vocab_rows(sd["lm_head.weight"])
    out["model.norm.weight"] = sd["model.norm.weight"]
    return out


def _shard_moe(cfg: ModelConfig, sd, out, topo: Topology, r: int, p: str, q: str, block: str, names) -> None:
    """A sparse layer's tensors for tensor-parallel rank r (layer prefix p in sd, q in out)."""
    T = topo.tp
    qb = q + block[len(p):]
    out[qb + "gate.weight"] = sd[block + "gate.weight"]
    gate, up, down = names
    if topo.ep > 1:  # whole experts, a contiguous run per rank; the shared expert replicated
        per = cfg.num_experts // topo.ep
        for e in range(r * per, (r + 1) * per):
            for n in names:
                out[expert_weight(qb, e, n)] = sd[expert_weight(block, e, n)]
        for key in [k for k in sd if k.startswith(block + "shared_expert")]:
            out[qb + key[len(block):]] = sd[key]
        return

    def split(key_in: str, key_out: str, n: int, by_cols: bool) -> None:
        t = sd[key_in]
        out[key_out] = (t[:, r * n:(r + 1) * n] if by_cols else t[r * n:(r + 1) * n]).clone()

    inter = cfg.moe_intermediate_size // T
    for e in range(cfg.num_experts):
        for n in (gate, up):
            split(expert_weight(block, e, n), expert_weight(qb, e, n), inter, False)
        split(expert_weight(block, e, down), expert_weight(qb, e, down), inter, True)
    if block + "shared_expert.gate_proj.weight" in sd:
        s_in, s_out, n = block + "shared_expert.", qb + "shared_expert.", cfg.shared_expert_intermediate_size // T
        for name in ("gate_proj", "up_proj"):
            split(s_in + name + ".weight", s_out + name + ".weight", n, False)
        split(s_in + "down_proj.weight", s_out + "down_proj.weight", n, True)
        out[qb + "shared_expert_gate.weight"] = sd[block + "shared_expert_gate.weight"]
