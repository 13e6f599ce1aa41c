"""ParallelSpec: what the model-parallel executor needs to know of the engine's settings."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class ParallelSpec:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    expert_parallel_size: int = 1
    device: torch.device = torch.device("cpu")
    dtype: Optional[torch.dtype] = None       # None: the device's default (models.loader.default_dtype)
    seed: int = 0                             # the dummy loader's weights
    timeout_s: float = 60.0                   # a collective not complete by then is an error

    @property
    def ranks_per_stage(self) -> int:
        """Ranks sharing each pipeline stage: attention split over them by heads, experts by expert."""
        return max(self.tensor_parallel_size, self.expert_parallel_size)

    @property
    def world_size(self) -> int:
        return self.ranks_per_stage * self.pipeline_parallel_size
