"""The control plane: rank 0's messages to every rank over the control group (pickled objects:
setup, each step's inputs, stats requests, stop) and the replies it gathers."""
from __future__ import annotations

import traceback
from typing import Optional

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


