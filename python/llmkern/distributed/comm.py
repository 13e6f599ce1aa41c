"""The collectives model parallelism needs, over torch.distributed, each one counted: payload bytes
and wall time per kind (on CPU gloo runs them synchronously, so the time is the time the rank
spent in them; on CUDA NCCL queues them on the stream and the time is only the launch)."""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Dict, List, Optional

import torch
import torch.distributed as dist


class CommStats:
    def __init__(self):
        self.calls: Dict[str, int] = defaultdict(int)
        self.bytes: Dict[str, int] = defaultdict(int)
        self.seconds: Dict[str, float] = defaultdict(float)

    def add(self, kind: str, nbytes: int, seconds: float) -> None:
        self.calls[kind] += 1
        self.bytes[kind] += nbytes
        self.seconds[kind] += seconds

    def summary(self) -> dict:
        return {"calls": dict(self.calls), "bytes": dict(self.bytes), "seconds": dict(self.seconds),
                "total_bytes": sum(self.bytes.values()), "total_seconds": sum(self.seconds.values())}

    def reset(self) -> None:
        self.calls.clear()
        self.bytes.clear()
        self.seconds.clear()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Comm:
    """One rank's view: its tensor-parallel group (None when T == 1) and point-to-point peers on
    the world group."""

    def __init__(self, rank: int, tp_group, tp_ranks: List[int], world_group):
        self.rank = rank
        self.world_group = world_group
        self.tp_group = tp_group
        self.tp_ranks = tp_ranks
        self.stats = CommStats()

    def all_reduce(self, x: torch.Tensor) -> None:
        """In place: x = sum of x over the tensor-parallel group."""
        t0 = time.perf_counter()
        dist.all_reduce(x, group=self.tp_group)
        self.stats.add("all_reduce", _nbytes(x), time.perf_counter() - t0)

    def gather_logits(self, local: torch.Tensor, vocab: int) -> Optional[torch.Tensor]:
        """Vocab shards [R, V/T] -> full fp32 logits [R, vocab] on the group's first rank (None on
        the others). A gather, not an all-gather: one rank samples."""
        if self.tp_group is None:
            return local[:, :vocab]
        t0 = time.perf_counter()
        root = self.tp_ranks[0]
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in self.tp_ranks] if self.rank == root else None
        dist.gather(local, parts, dst=root, group=self.tp_group)
        self.stats.add("gather", _nbytes(local), time.perf_counter() - t0)
        if parts is None:
            return None
        return torch.cat(parts, dim=1)[:, :vocab]

    @property
    def tp_index(self) -> int:
        """This rank's place in its tensor-parallel group."""
        return self.tp_ranks.index(self.rank)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: List[int], in_splits: List[int],
                   kind: str = "all_to_all") -> None:
        """Rows [sum(in_splits), ...] of inp go in runs of in_splits[i] to the i-th rank of the
        tensor-parallel group; out receives sum(out_splits) rows, rank i's run first. Counted:
        the bytes that leave this rank (its own run stays in memory)."""
        t0 = time.perf_counter()
        dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.tp_group)
        row = inp[0].numel() * inp.element_size() if inp.shape[0] else 0
        self.stats.add(kind, (sum(in_splits) - in_splits[self.tp_index]) * row, time.perf_counter() - t0)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[n, ...] from every rank of the tensor-parallel group -> [group size * n, ...] in rank order."""
        t0 = time.perf_counter()
        parts = [torch.empty_like(x) for _ in self.tp_ranks]
        dist.all_gather(parts, x.contiguous(), group=self.tp_group)
        self.stats.add("all_gather", _nbytes(x), time.perf_counter() - t0)
        return torch.cat(parts)

    def isend(self, t: torch.Tensor, dst: int, kind: str = "send"):
        """Non-blocking send; returns (work, the tensor it reads), to keep until the work is done.
        Its bytes are counted here; the wait shows up in the receiver's recv time."""
        t = t.contiguous()
        work = dist.isend(t, dst, group=self.world_group)
        self.stats.add(kind, _nbytes(t), 0.0)
        return work, t

    def recv(self, shape, dtype: torch.dtype, device, src: int, kind: str = "recv") -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype, device=device)
        t0 = time.perf_counter()
        dist.recv(t, src, group=self.world_group)
        self.stats.add(kind, _nbytes(t), time.perf_counter() - t0)
        return t
