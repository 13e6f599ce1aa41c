"""A worker rank: join the world, build its stage when rank 0 says what to load, then execute
steps until told to stop. A step's error ends the process with a traceback (its peers see the
closed connection and rank 0 reports it).

Started by the engine on its own machine (launch.LocalWorkers) or by a torchrun-style launcher:
    MASTER_ADDR=... MASTER_PORT=... RANK=r WORLD_SIZE=w python -m llmkern.distributed.worker"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from . import launch
from .control import StageChain, bcast, gather_to_root, try_report


def main() -> None:
    env = launch.env_launch()
    if env is None or env["rank"] == 0:
        raise SystemExit("llmkern worker: needs RANK >= 1 and WORLD_SIZE > 1 (and MASTER_ADDR, MASTER_PORT) in "
                         "the environment, as torchrun sets them; rank 0 is the engine")
    if os.environ.get("LLMKERN_WATCH_STDIN") == "1":
        launch.watch_stdin()
    launch.set_threads(launch.threads_per_rank(env["local_world_size"]))
    launch.announce_ready(env["rank"], env["world_size"])
    setup_group = launch.init_env(env["rank"], env["world_size"])
    sys.exit(run(env["rank"], setup_group, env["local_rank"]))


def run(rank: int, setup_group, local_rank: int) -> int:
    from ..models.loader import read_checkpoint
    from .stage import Stage, to_device

    kind, setup = bcast(setup_group)
    assert kind == "setup", kind
    topo = setup["topology"]
    device = torch.device("cpu")
    if setup["device_type"] == "cuda":
        device = torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    groups = launch.make_groups(topo, rank, device.type, setup["timeout_s"])

    def build():
        cfg, sd, _ = read_checkpoint(setup["model"], setup["load_format"], setup["seed"])
        return Stage(cfg, sd, topo, rank, groups, setup["dtype"], device)

    stage, err = try_report(build)
    gather_to_root(setup_group, err)
    kind, kv_spec = bcast(setup_group)
    if kind == "stop" or stage is None:
        return 0 if kind == "stop" else 1
    _, err = try_report(lambda: stage.build_kv(kv_spec))
    gather_to_root(setup_group, err)
    ctrl = groups.ctrl
    chain = StageChain(topo, rank, ctrl, max_pending=8 * topo.pp) if topo.pp > 1 else None
    while True:
        msg = bcast(ctrl) if chain is None else chain.recv()
        kind = msg[0]
        if kind == "step":
            stage.run(to_device(msg[1], device))
        elif kind == "stats":
            gather_to_root(ctrl, stage.stats())
            if msg[1]:
                stage.reset_stats()
        elif kind == "stop":
            if chain is not None:  # the next stage takes the stop (and what came before it) first
                chain.pending.wait_all()
                stage.sends.wait_all()
            break
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    main()
