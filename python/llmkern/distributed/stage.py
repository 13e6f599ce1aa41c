"""One rank's part of the model: its shard of the weights (sharding.py), its KV cache (its heads of
its stage's layers only, with the block ids the engine's KV manager hands out), and its part of
each step: receive the previous stage's hidden states, run the layers, pass them on or, on the
last stage, assemble the logits for rank 0 (which samples)."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import torch

from ..kvcache import KVSpec, build_kv_tiers
from ..layers.attention import AttnMetadata
from ..models.config import ModelConfig
from ..models.llama import LlamaForCausalLM
from .comm import Comm
from .control import PendingSends, process_io_bytes
from .expert_parallel import ExpertParallel
from .launch import Groups
from .sharding import check_parallel, local_config, shard_state_dict
from .topology import Topology

# One step as every rank gets it: (input_ids, positions, metadata, sample rows, KV block copies
# the engine made since the last step: [(src tier, dst tier, [(src, dst) block pairs])]).
StepMessage = Tuple[torch.Tensor, torch.Tensor, AttnMetadata, torch.Tensor, List[tuple]]


def to_device(msg: StepMessage, device: torch.device) -> StepMessage:
    if device.type == "cpu":
        return msg
    ids, pos, meta, rows, copies = msg
    mv = {f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)}
    mv = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in mv.items()}
    return ids.to(device), pos.to(device), AttnMetadata(**mv), rows.to(device), copies


class Stage:
    def __init__(self, cfg: ModelConfig, sd: Dict[str, torch.Tensor], topo: Topology, rank: int,
                 groups: Groups, dtype: torch.dtype, device: torch.device):
        check_parallel(cfg, topo)
        self.full_config = cfg
        self.topo, self.rank, self.device = topo, rank, device
        stage = topo.stage_of(rank)
        self.is_first, self.is_last = stage == 0, stage == topo.pp - 1
        local_cfg, vocab_start = local_config(cfg, topo, rank)
        shard = shard_state_dict(cfg, sd, topo, rank)
        sd.clear()
        self.comm = Comm(rank, groups.tp, groups.tp_ranks, groups.world)
        m = LlamaForCausalLM.from_state_dict(local_cfg, shard, dtype, device)
        m.vocab_start = vocab_start
        m.is_first_stage, m.is_last_stage = self.is_first, self.is_last
        m.tp_reduce = self.comm.all_reduce if topo.tp > 1 else None
        self.ep = ExpertParallel(self.comm, topo.ep) if topo.ep > 1 else None
        if self.ep is not None:
            m.moe_forward = self.ep
        self.model = m
        self.kv = None
        # Hidden states and logits leave with non-blocking sends, so a stage starts its next
        # micro-batch while the next stage is still busy with the previous one.
        self.sends = PendingSends(max_pending=4 * topo.pp)
        self.steps = 0

    def stats(self) -> dict:
        """Counters since the last reset: steps run, collectives ("comm"), bytes this process wrote
        through system calls in all ("io_bytes"), and with expert parallelism the MoE dispatch's
        ("moe")."""
        out = {"steps": self.steps, "comm": self.comm.stats.summary(), "io_bytes": process_io_bytes()}
        if self.ep is not None:
            out["moe"] = self.ep.stats.summary()
        return out

    def reset_stats(self) -> None:
        self.steps = 0
        self.comm.stats.reset()
        if self.ep is not None:
            self.ep.stats.reset()

    def build_kv(self, spec: KVSpec) -> None:
        """spec has the block counts resolved by rank 0 (the same on every rank)."""
        self.kv = build_kv_tiers(spec, [self.model.config.kv_layout], self.model.dtype, self.device)

    def run(self, msg: StepMessage) -> Optional[torch.Tensor]:
        """This rank's part of a step. Returns the full fp32 logits [rows, vocab] on the rank that
        assembles them, None elsewhere."""
        ids, pos, meta, rows, copies = msg
        self.steps += 1
        for src, dst, pairs in copies:
            self.kv.copy_blocks_between(src, dst, pairs)
        n, hidden_size = ids.shape[0], self.full_config.hidden_size
        m, comm, topo = self.model, self.comm, self.topo
        inter = None
        if not self.is_first:  # hidden states and residual of the previous stage, as one message
            x = comm.recv((2, n, hidden_size), m.dtype, self.device, topo.peer(self.rank, -1), "pp_recv")
            inter = (x[0], x[1])
        out = m.forward(ids, pos, meta, self.kv.caches, inter)
        if not self.is_last:
            self.sends.add(*comm.isend(torch.stack(out), topo.peer(self.rank, +1), "pp_send"))
            return None
        if rows.numel() == 0:
            return None
        logits = comm.gather_logits(m.compute_logits(out, rows), self.full_config.vocab_size)
        if logits is not None and self.rank != 0:  # the last stage's root hands them to the sampler
            self.sends.add(*comm.isend(logits, 0, "logits_send"))
            return None
        return logits
