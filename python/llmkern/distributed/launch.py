"""Process-group setup and the lifetime of local worker processes.

Two ways in:
- local: the engine's process (rank 0) hosts a TCPStore on 127.0.0.1, starts ranks 1..W-1 as
  worker processes pointed at it (LocalWorkers) and waits for them to check in, watching them for
  an early death;
- env:// (torchrun-style): every rank was started by a launcher with RANK, WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT (and LOCAL_RANK, LOCAL_WORLD_SIZE) set; rank 0 runs the engine, the
  others `python -m llmkern.distributed.worker`.

Groups, created in the same order on every rank:
- the default group (gloo): rendezvous only;
- setup (gloo, no practical timeout): what to load, and each rank's report (loading may be slow);
- control (gloo): rank 0 broadcasts each step's inputs; idle workers wait here with no practical
  timeout (the engine may idle; a dead peer still ends the wait at once: its sockets close),
  while rank 0's side times out after distributed_timeout_s;
- compute (gloo on CPU, NCCL on CUDA, timeout distributed_timeout_s): the whole world for the
  pipeline's send/recv, and one tensor-parallel group per stage.
A local worker also exits when its engine dies (it watches a pipe), so no rank outlives the
engine that started it."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import List, Optional

import torch
import torch.distributed as dist

from .._build import set_num_threads
from .topology import Topology

STARTUP_TIMEOUT_S = 300.0          # ranks joining (interpreter start, torch import)
IDLE_TIMEOUT = timedelta(days=7)   # workers wait for the engine's next message this long
_READY = "llmkern/ready/"


def env_launch() -> Optional[dict]:
    """The torchrun-style variables when this process was started as one rank of several, else None."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    world = int(os.environ["WORLD_SIZE"])
    if world <= 1:
        return None
    rank = int(os.environ["RANK"])
    return {"rank": rank, "world_size": world, "local_rank": int(os.environ.get("LOCAL_RANK", rank)),
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", world))}


def threads_per_rank(local_world_size: int) -> int:
    """This rank's share of the CPUs the process may run on."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return max(1, n // max(1, local_world_size))


def set_threads(n: int) -> None:
    """Intra-op threads of torch and of llmkern's CPU kernels."""
    torch.set_num_threads(n)
    set_num_threads(n)


def watch_stdin() -> None:
    """Exit at once when stdin closes: the engine that started this worker holds the pipe's other
    end, so its death (however it dies) ends the worker too (no orphans)."""

    def wait():
        try:
            while os.read(0, 4096):  # the raw fd: no buffered-reader lock held at interpreter exit
                pass
        finally:
            os._exit(3)

    threading.Thread(target=wait, name="llmkern-parent-watch", daemon=True).start()


def compute_backend(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


@dataclass
class Groups:
    ctrl: object             # steps, stats, stop (gloo); timeout: the engine's, or idle on workers
    world: object            # compute: pipeline send/recv
    tp: Optional[object]     # compute: this rank's tensor-parallel group (None when T == 1)
    tp_ranks: List[int]


def make_groups(topo: Topology, rank: int, device_type: str, timeout_s: float) -> Groups:
    """The control and compute groups (a collective call on every rank, in the same order). A
    group's timeout is each process's own: rank 0 gives up on a control message after timeout_s
    (a peer that stopped answering), workers wait for the next one as long as the engine idles."""
    timeout = timedelta(seconds=timeout_s)
    backend = compute_backend(device_type)
    ranks = list(range(topo.world_size))
    ctrl = dist.new_group(ranks, timeout=timeout if rank == 0 else IDLE_TIMEOUT, backend="gloo")
    world = dist.new_group(ranks, timeout=timeout, backend=backend)
    mine = None
    for s in range(topo.pp):
        g = dist.new_group(topo.tp_group(s), timeout=timeout, backend=backend) if topo.tp > 1 else None
        if topo.stage_of(rank) == s:
            mine = g
    return Groups(ctrl, world, mine, topo.tp_group(topo.stage_of(rank)))


def init_env(rank: int, world_size: int) -> object:
    """Join a torchrun-style (env://) world; returns the setup group (setup messages and replies,
    no practical timeout: loading a large checkpoint may take long)."""
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=STARTUP_TIMEOUT_S))
    return dist.new_group(list(range(world_size)), timeout=IDLE_TIMEOUT, backend="gloo")


def init_store(store, rank: int, world_size: int) -> object:
    """Rank 0 of a local launch: host the rendezvous; returns the setup group."""
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=STARTUP_TIMEOUT_S))
    return dist.new_group(list(range(world_size)), timeout=IDLE_TIMEOUT, backend="gloo")


class LocalWorkers:
    """Ranks 1..W-1 as child processes of this one, each `python -m llmkern.distributed.worker`
    with torchrun's variables pointing at a TCPStore this process hosts on loopback (the entry a
    launcher uses on other machines). Not multiprocessing's spawn: that re-runs the user's main
    script in every child unless it has a __main__ guard. A child watches its stdin, a pipe only
    this process holds, and exits when it closes (this process died)."""

    def __init__(self, world_size: int):
        self.store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True,
                                   timeout=timedelta(seconds=STARTUP_TIMEOUT_S), wait_for_workers=False)
        self.procs: List[subprocess.Popen] = []
        try:
            for r in range(1, world_size):
                env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.store.port), RANK=str(r),
                           WORLD_SIZE=str(world_size), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world_size),
                           LLMKERN_WATCH_STDIN="1")
                self.procs.append(subprocess.Popen([sys.executable, "-m", "llmkern.distributed.worker"],
                                                   stdin=subprocess.PIPE, env=env))
            self._wait_ready(world_size)
        except BaseException:
            self.reap(grace_s=0)
            raise

    def rendezvous_store(self):
        """The store as init_process_group(init_method="env://") on the other ranks sees it."""
        return dist.PrefixStore("default_pg", self.store)

    def _wait_ready(self, world_size: int) -> None:
        keys = [f"{_READY}{r}" for r in range(1, world_size)]
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self.store.check(keys):
                return
            dead = self.dead()
            if dead:
                raise RuntimeError(f"distributed: worker {dead[0]} before joining the process group")
            if time.monotonic() > deadline:
                raise RuntimeError(f"distributed: workers did not start within {STARTUP_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def dead(self, wait_s: float = 0.0) -> List[str]:
        """Descriptions of workers that have exited ('rank 2 (pid 123) exited with code -9'),
        waiting up to wait_s for one to show up (a peer's socket closes before its exit code is in)."""
        deadline = time.monotonic() + wait_s
        while True:
            out = [f"rank {r} (pid {p.pid}) exited with code {p.returncode}"
                   for r, p in enumerate(self.procs, 1) if p.poll() is not None]
            if out or time.monotonic() >= deadline:
                return out
            time.sleep(0.05)

    def reap(self, grace_s: float = 5.0) -> None:
        """Every child gone: a grace period to exit by itself, then SIGTERM, then SIGKILL."""
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdin is not None:
                p.stdin.close()


def announce_ready(rank: int, world_size: int) -> None:
    """Check in with rank 0's store before the (blocking) rendezvous, so it can tell a worker that
    is still starting from one that died."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
                          timeout=timedelta(seconds=STARTUP_TIMEOUT_S))
    store.set(f"{_READY}{rank}", "1")
