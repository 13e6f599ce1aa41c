"""The mixture-of-experts MLP of Mixtral / Qwen2-MoE / Qwen3-MoE: router linear -> top-k softmax ->
fused experts, plus Qwen2-MoE's shared expert scaled by its sigmoid gate.

The steps are separate methods so that expert parallelism (llmkern.distributed) can route tokens on
one rank and run the experts on another; __call__ is the single-process composition."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple, Union

import torch

from ..ops.moe import MoEWeights, fused_moe, pack_moe_weights, topk_softmax
from .linear import GateUpLinear, Linear


class SharedExpert:
    """A dense gated-SiLU MLP whose output is scaled by sigmoid(gate(x)) (Qwen2-MoE)."""

    __slots__ = ("gate_up", "down", "gate")

    def __init__(self, gate_up: GateUpLinear, down: Linear, gate: Linear):
        self.gate_up, self.down, self.gate = gate_up, down, gate

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down(self.gate_up(x))
        return out.mul_(torch.sigmoid(self.gate(x)))


class MoE:
    """Routed experts `[first_expert, first_expert + local experts)` of `num_experts` (all of them
    outside expert parallelism), stacked as w13 [E, 2I, H] (gate rows, then up rows) and w2 [E, H, I];
    on CPU packed once for llmkern's GEMMs (fp32 panels, or bf16 ones for the bf16 GEMM)."""

    def __init__(self, router: Linear, w13: torch.Tensor, w2: torch.Tensor, top_k: int, renormalize: bool,
                 num_experts: int, first_expert: int = 0, shared: Optional[SharedExpert] = None):
        self.router = router
        self.top_k, self.renormalize, self.num_experts = top_k, renormalize, num_experts
        self.first_expert, self.num_local = first_expert, w13.shape[0]
        self.shared = shared
        self.packed = w13.device.type == "cpu" and w13.dtype in (torch.float32, torch.bfloat16)
        self.experts: Tuple[Union[torch.Tensor, MoEWeights], Optional[torch.Tensor]] = (
            (pack_moe_weights(w13, w2), None) if self.packed else (w13, w2))
        # global expert id -> row of the local stack, -1 for experts held by other ranks
        expert_map = torch.full((num_experts,), -1, dtype=torch.int32)
        expert_map[first_expert:first_expert + self.num_local] = torch.arange(self.num_local, dtype=torch.int32)
        self.expert_map = None if self.num_local == num_experts else expert_map.to(w13.device)

    def route(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (fp32 weights [T, k], int32 global expert ids [T, k])."""
        return topk_softmax(self.router(x), self.top_k, self.renormalize)

    def run_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """sum over the token's top-k of weight * expert(x), over the experts held here only."""
        w13, w2 = self.experts
        return fused_moe(x, w13, w2, weights, ids, expert_map=self.expert_map)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        out = self.run_experts(x, weights, ids)
        if self.shared is not None:
            out.add_(self.shared(x))
        return out

    def expert_tensors(self) -> List[torch.Tensor]:
        """The stacked expert weights (packed or not), for moving them (models/hugepages.py)."""
        w13, w2 = self.experts
        return [w13.w13, w13.w2] if self.packed else [w13, w2]

    def set_expert_tensors(self, ts: List[torch.Tensor]) -> None:
        """Replace the tensors expert_tensors() returned with copies of them."""
        self.experts = (dataclasses.replace(self.experts[0], w13=ts[0], w2=ts[1]), None) if self.packed \
            else (ts[0], ts[1])
