"""Checkpoint names of a sparse layer's weights, per HF family, and their stacking into the
[E, 2I, H] / [E, H, I] tensors the fused MoE kernel reads.

Mixtral:   block_sparse_moe.gate, block_sparse_moe.experts.N.{w1 (gate), w3 (up), w2 (down)}
Qwen-MoE:  mlp.gate, mlp.experts.N.{gate,up,down}_proj, mlp.shared_expert.{gate,up,down}_proj,
           mlp.shared_expert_gate (the GGUF reader writes these names for every family)."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

_MIXTRAL = ("block_sparse_moe.", ("w1", "w3", "w2"))
_QWEN = ("mlp.", ("gate_proj", "up_proj", "down_proj"))


def moe_layout(sd: Dict[str, torch.Tensor], p: str) -> Optional[Tuple[str, Tuple[str, str, str]]]:
    """(prefix of the sparse block, names of gate/up/down) when layer prefix p is sparse in sd, else None."""
    for block, names in (_MIXTRAL, _QWEN):
        if p + block + "gate.weight" in sd:
            return p + block, names
    return None


def expert_weight(block: str, e: int, name: str) -> str:
    return f"{block}experts.{e}.{name}.weight"


def stack_experts(take, block: str, names: Tuple[str, str, str], first: int, count: int
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(w13 [count, 2I, H], w2 [count, H, I]) of experts [first, first + count), taking (popping)
    each expert's tensors with take(name)."""
    g, u, d = names
    w13, w2 = [], []
    for e in range(first, first + count):
        w13.append(torch.cat([take(expert_weight(block, e, g)), take(expert_weight(block, e, u))]))
        w2.append(take(expert_weight(block, e, d)))
    return torch.stack(w13), torch.stack(w2)
