"""build_connector: a KV connector from the plain spec a CLI, a server or EngineConfig passes."""
from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

from .interface import KVConnector
from .pull import STORE_TIMEOUT_S


def build_connector(spec: dict) -> KVConnector:
    """A connector from a plain spec (what a CLI or server passes through EngineConfig):
    {"kind": "p2p" (alias "torch") | "shm", "rank": R, "world_size": W, "master_addr": "127.0.0.1",
     "master_port": N, "group": "default", "timeout_s": 60, "backend": "gloo" | "nccl" (p2p),
     "shm_dir": "/dev/shm" (shm)}. Rank 0 hosts the store unless "is_master" says otherwise
    (master_port 0: any free port, see PullConnector.store_port); the others connect to it
    (`serve --pd`'s launcher hosts it and gives every replica is_master False, so that the store
    outlives a replica that restarts and rejoins); or
    "store": an existing torch.distributed Store object; "rendezvous": "HOST:PORT" stands for
    master_addr and master_port; keys set to None take their defaults. master_addr / master_port default to the
    MASTER_ADDR / MASTER_PORT environment variables (env:// style)."""
    if not isinstance(spec, dict):
        raise ValueError(f"kv_connector: expected a dict spec, got {type(spec).__name__}")
    spec = {k: v for k, v in spec.items() if v is not None}  # unset CLI options: the defaults
    kind = {"torch": "p2p"}.get(spec.get("kind"), spec.get("kind"))
    if kind not in ("p2p", "shm"):
        raise ValueError(f"kv_connector: kind must be 'p2p' (or 'torch') or 'shm', got {kind!r}")
    if "rendezvous" in spec:  # "HOST:PORT"
        host, _, port = str(spec.pop("rendezvous")).rpartition(":")
        if not host:
            raise ValueError(f"kv_connector: rendezvous must be HOST:PORT, got {host}:{port}")
        spec.update(master_addr=host, master_port=port)
    known = {"kind", "rank", "world_size", "master_addr", "master_port", "group", "timeout_s", "backend",
             "shm_dir", "store", "is_master"}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise ValueError(f"kv_connector: unknown key(s) {', '.join(unknown)}")
    rank, world = spec.get("rank"), spec.get("world_size")
    if not isinstance(world, int) or world < 2:
        raise ValueError(f"kv_connector: world_size must be an integer >= 2, got {world!r}")
    if not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"kv_connector: rank must be an integer in [0, {world}), got {rank!r}")
    timeout_s = spec.get("timeout_s", 60.0)
    if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ValueError(f"kv_connector: timeout_s must be > 0, got {timeout_s!r}")
    store = spec.get("store")
    if store is None:
        addr = spec.get("master_addr", os.environ.get("MASTER_ADDR", "127.0.0.1"))
        port = spec.get("master_port", os.environ.get("MASTER_PORT"))
        try:
            port = int(port)
        except (TypeError, ValueError):
            raise ValueError(f"kv_connector: master_port must be a port number, got {port!r}") from None
        store = dist.TCPStore(addr, port, world, is_master=bool(spec.get("is_master", rank == 0)), wait_for_workers=False,
                              timeout=timedelta(seconds=STORE_TIMEOUT_S))
    group = str(spec.get("group", "default"))
    if kind == "p2p":
        from .p2p import P2PConnector

        backend = spec.get("backend", "gloo")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"kv_connector: backend must be 'gloo' or 'nccl', got {backend!r}")
        return P2PConnector(store, rank, world, group, float(timeout_s), backend)
    from .shm import ShmConnector

    return ShmConnector(store, rank, world, group, float(timeout_s), spec.get("shm_dir"))
