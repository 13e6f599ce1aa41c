"""Ranks, pipeline stages and tensor-parallel groups of a T x P layout (no communication here)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple


@dataclass(frozen=True)
class Topology:
    tp: int           # tensor-parallel size T
    pp: int           # pipeline-parallel size P
    num_layers: int   # decoder layers of the whole model
    ep: int = 1       # expert-parallel size: 1, or tp (a stage's ranks split the experts between them)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    def stage_of(self, rank: int) -> int:
        return rank // self.tp

    def tp_rank_of(self, rank: int) -> int:
        return rank % self.tp

    def tp_group(self, stage: int) -> List[int]:
        """The ranks that shard the layers of one stage."""
        return list(range(stage * self.tp, (stage + 1) * self.tp))

    def layers(self, stage: int) -> Tuple[int, int]:
        """[first, end) decoder layers of a stage: contiguous, sizes differing by at most one
        (the earlier stages take the extra layers)."""
        base, extra = divmod(self.num_layers, self.pp)
        first = stage * base + min(stage, extra)
        return first, first + base + (1 if stage < extra else 0)

    def max_stage_layers(self) -> int:
        return -(-self.num_layers // self.pp)

    def peer(self, rank: int, stage_delta: int) -> int:
        """The rank with the same tensor-parallel index in a neighbouring stage."""
        return rank + stage_delta * self.tp

    @property
    def last_stage_root(self) -> int:
        """The rank that assembles the logits (tensor-parallel rank 0 of the last stage)."""
        return (self.pp - 1) * self.tp
