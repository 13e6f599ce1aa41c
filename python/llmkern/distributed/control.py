"""The control plane: rank 0's messages to every rank over the control group (pickled objects:
setup, each step's inputs, stats requests, stop) and the replies it gathers.

Without pipeline parallelism a message is a broadcast. With it, a broadcast would hold rank 0
until every stage had posted its receive, i.e. until the last stage finished its previous
micro-batch; so messages travel down the pipeline instead (StageChain): rank 0 sends to the other
ranks of stage 0 and to its peer in stage 1, every rank forwards to its peer in the next stage,
all with non-blocking sends, so each stage takes a step's message when it is ready for it."""
from __future__ import annotations

import pickle
import traceback
from collections import deque
from typing import Optional

import torch
import torch.distributed as dist


def bcast(ctrl, msg=None):
    """Rank 0 sends msg to every rank of the control group; every rank returns it."""
    box = [msg]
    dist.broadcast_object_list(box, src=0, group=ctrl)
    return box[0]


def gather_to_root(ctrl, obj):
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0, group=ctrl)
    return out


class StageChain:
    """One rank's place on the message path of a pipeline-parallel world (see the module doc)."""

    def __init__(self, topo, rank: int, ctrl, max_pending: int):
        stage = topo.stage_of(rank)
        self.ctrl = ctrl
        self.src = None if rank == 0 else (0 if stage == 0 else topo.peer(rank, -1))
        self.dsts = [r for r in topo.tp_group(0) if r != 0] if rank == 0 else []
        if stage < topo.pp - 1:
            self.dsts.append(topo.peer(rank, +1))
        self.pending = PendingSends(max_pending)

    def post(self, msg) -> None:
        """Rank 0: send msg on its way."""
        self._forward(_encode(msg))

    def recv(self):
        """Other ranks: the next message (blocking), already forwarded down the chain."""
        size = torch.empty(1, dtype=torch.int64)
        dist.recv(size, self.src, group=self.ctrl)
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.recv(data, self.src, group=self.ctrl)
        self._forward((size, data))
        return pickle.loads(data.numpy().tobytes())

    def _forward(self, parts) -> None:
        for dst in self.dsts:
            for t in parts:
                self.pending.add(dist.isend(t, dst, group=self.ctrl), t)


class PendingSends:
    """Non-blocking sends still in progress, with the tensors they read; the oldest are waited for
    once more than max_pending are outstanding (the receivers take them in order, so this only
    bounds memory, it cannot wait on a step that has not been sent)."""

    def __init__(self, max_pending: int):
        self.max_pending = max_pending
        self.works = deque()

    def add(self, work, tensor) -> None:
        self.works.append((work, tensor))
        while len(self.works) > self.max_pending:
            self.works.popleft()[0].wait()

    def wait_all(self) -> None:
        while self.works:
            self.works.popleft()[0].wait()


def _encode(msg):
    data = torch.frombuffer(bytearray(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
    return torch.tensor([data.numel()], dtype=torch.int64), data


def process_io_bytes() -> Optional[int]:
    """Bytes this process has written through system calls (sockets included), from /proc."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def try_report(fn):
    try:
        return fn(), None
    except Exception as e:  # reported to rank 0, which raises it for the whole engine
        traceback.print_exc()
        return None, f"{type(e).__name__}: {e}"


