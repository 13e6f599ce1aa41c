"""The engine's side of model parallelism (rank 0): start or join the other ranks, hand them the
model and the KV geometry, then per step broadcast the flat inputs, run rank 0's own stage and
return the logits the last stage assembled.

Sampling happens once, on rank 0, from the gathered logits; the tokens reach the other ranks as
the next step's input ids. Why not sample identically everywhere: the sampler's state (per-request
generators, penalties over each sequence's history, speculative verification, stop checks) lives
with the scheduler on rank 0, and keeping copies of it in step on every rank would be a second
source of truth for no gain: only the last stage has logits, and one gather of [rows, V/T] per
rank is all the sampling costs in communication.

Faults: any error in a step's communication (a peer's closed connection, a collective past
distributed_timeout_s) shuts the engine down -- workers reaped, process group destroyed -- and
raises DistributedError naming the worker that died, if one did."""
from __future__ import annotations

import atexit
import re
import dataclasses
import weakref
from typing import List, Optional

import torch
import torch.distributed as dist

from .._build import get_num_threads, set_num_threads
from ..kvcache import CPU_KV_DEFAULT_GIB, KVSpec, kv_block_counts
from ..models.loader import default_dtype, read_checkpoint
from . import launch
from .spec import ParallelSpec
from .sharding import check_parallel, local_config
from .stage import Stage, to_device
from .topology import Topology
from .control import StageChain, bcast, gather_to_root, try_report


class DistributedError(RuntimeError):
    """A rank died or a collective did not complete; the engine is shut down."""


class ParallelExecutor:
    def __init__(self, model, par: ParallelSpec, kv: KVSpec, load_format: str = "auto"):
        """kv: the engine's KV settings; self.kv_spec holds them with every tier's block count
        resolved (the same on every rank)."""
        T, P, E = par.ranks_per_stage, par.pipeline_parallel_size, par.expert_parallel_size
        world = T * P
        env = launch.env_launch()
        if env is not None and env["rank"] != 0:
            raise RuntimeError(f"distributed: this process is rank {env['rank']}; rank 0 runs the engine, the "
                               f"others run `python -m llmkern.distributed.worker`")
        if env is not None and env["world_size"] != world:
            raise ValueError(f"tensor/expert_parallel_size x pipeline_parallel_size: {T} x {P} = {world} ranks, but "
                             f"WORLD_SIZE is {env['world_size']}")
        if dist.is_available() and dist.is_initialized():
            raise RuntimeError("distributed: this process already has a torch.distributed process group "
                               "(one model-parallel engine per process; shut the other one down first)")
        device = par.device
        if device.type == "cuda":
            device = torch.device("cuda", env["local_rank"] if env else 0)
            torch.cuda.set_device(device)
        dtype = par.dtype or default_dtype(device)
        cfg, sd, self.tokenizer = read_checkpoint(model, load_format, par.seed)
        topo = Topology(T, P, cfg.num_layers, E)
        check_parallel(cfg, topo)  # before any process starts
        self.topo, self.device, self.model_config = topo, device, cfg
        self.timeout_s = par.timeout_s
        self.failed: Optional[str] = None
        self.closed = False
        self.workers = None
        self._threads = (torch.get_num_threads(), get_num_threads())  # restored by shutdown()
        self.setup_group = self.ctrl = self.chain = None
        try:  # from here on a failure stops whatever was started (shutdown copes with a partial start)
            launch.set_threads(launch.threads_per_rank(env["local_world_size"] if env else world))
            if env is not None:
                setup = launch.init_env(0, world)
            else:
                self.workers = launch.LocalWorkers(world)
                setup = launch.init_store(self.workers.rendezvous_store(), 0, world)
            self.setup_group = setup
            bcast(setup, ("setup", {"topology": topo, "model": model, "load_format": load_format,
                                        "seed": par.seed, "dtype": dtype, "device_type": device.type,
                                        "timeout_s": self.timeout_s}))
            groups = launch.make_groups(topo, 0, device.type, self.timeout_s)
            self.ctrl = groups.ctrl
            self.chain = StageChain(topo, 0, self.ctrl, max_pending=8 * topo.pp) if topo.pp > 1 else None
            self.stage, err = try_report(lambda: Stage(cfg, sd, topo, 0, groups, dtype, device))
            self._check(gather_to_root(setup, err), "build its shard of the model")
            local, _ = local_config(cfg, topo, 0)
            if device.type == "cpu" and kv.kv_cache_memory_gb is None:
                # The ranks on this machine share its memory: the default budget is split among them
                # (an explicit kv_cache_memory_gb is per rank, like a GPU's memory).
                n_local = env["local_world_size"] if env else world
                kv = dataclasses.replace(kv, kv_cache_memory_gb=CPU_KV_DEFAULT_GIB / n_local)
            n, n_off, n_swap = kv_block_counts(kv, [(topo.max_stage_layers(), local.num_kv_heads, local.head_dim)],
                                               dtype, device)
            self.kv_spec = dataclasses.replace(kv, num_gpu_blocks=n, num_cpu_offload_blocks=n_off,
                                               num_swap_blocks=n_swap)
            bcast(setup, ("kv", self.kv_spec))
            _, err = try_report(lambda: self.stage.build_kv(self.kv_spec))
            self._check(gather_to_root(setup, err), "allocate its KV cache")
        except BaseException:
            self.shutdown(graceful=False)
            raise
        self.kv = self.stage.kv  # rank 0's tiers: the engine puts its KVCacheManager on them
        self.copy_log: list = []  # tier copies rank 0's KV manager made, replayed by the other ranks
        self.model = self.stage.model  # rank 0's shard (its config is the shard's)
        ref = weakref.ref(self)
        atexit.register(lambda: ref() is not None and ref().shutdown())

    def _check(self, errors: List[Optional[str]], what: str) -> None:
        bad = [(r, e) for r, e in enumerate(errors) if e]
        if bad:
            bcast(self.setup_group, ("stop",))
            r, e = bad[0]
            raise RuntimeError(f"distributed: rank {r} could not {what}: {e}")

    # -- steps ----------------------------------------------------------------------------------
    def execute(self, input_ids: torch.Tensor, positions: torch.Tensor, meta, sample_rows: torch.Tensor
                ) -> Optional[torch.Tensor]:
        """One step on every rank (host tensors in). Returns fp32 logits [sample rows, vocab] on
        rank 0's device, or None when no row samples."""
        return self.finish(self.launch(input_ids, positions, meta, sample_rows))

    def launch(self, input_ids: torch.Tensor, positions: torch.Tensor, meta, sample_rows: torch.Tensor):
        """Start a step: send it on its way and run rank 0's stage. With pipeline parallelism this
        returns while the later stages work; finish() (in launch order) collects the logits."""
        self._check_open()
        copies = self.copy_log[:]
        self.copy_log.clear()
        msg = ("step", (input_ids, positions, meta, sample_rows, copies))
        try:
            self._send(msg)
            # rank 0's KV manager made its copies already; only the other ranks replay them
            logits = self.stage.run(to_device((input_ids, positions, meta, sample_rows, []), self.device))
        except Exception as e:
            raise self._fail(e) from e
        return logits, sample_rows.numel()

    def finish(self, flight) -> Optional[torch.Tensor]:
        """Returns fp32 logits [sample rows, vocab] on rank 0's device, or None when no row samples."""
        logits, rows = flight
        if self.topo.pp == 1 or rows == 0:
            return logits
        self._check_open()
        try:
            return self.stage.comm.recv((rows, self.model_config.vocab_size), torch.float32, self.device,
                                        self.topo.last_stage_root, "logits_recv")
        except Exception as e:
            raise self._fail(e) from e

    def _check_open(self) -> None:
        if self.failed or self.closed:
            raise DistributedError(self.failed or "distributed: the engine is shut down")

    def _send(self, msg) -> None:
        """A message to every other rank: a broadcast, or down the pipeline (control.StageChain)."""
        if self.chain is None:
            bcast(self.ctrl, msg)
        else:
            self.chain.post(msg)

    def _fail(self, e: Exception) -> DistributedError:
        dead = self.workers.dead(wait_s=2.0) if self.workers is not None else []
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        first = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", first)  # gloo's source location
        first = first.split(". ")[0]  # gloo appends generic advice
        if dead:
            msg = f"distributed: worker {dead[0]} during a step ({first}); the engine is shut down"
        else:
            msg = (f"distributed: a step's communication failed ({first}): a rank died or did not answer within "
                   f"distributed_timeout_s={self.timeout_s:g}; the engine is shut down")
        self.failed = msg
        self.shutdown(graceful=False)
        return DistributedError(msg)

    def stats(self, reset: bool = False) -> List[dict]:
        """Per rank: collective counters ("comm": calls, payload bytes and seconds per kind), the
        bytes the process wrote through system calls so far ("io_bytes", sockets included) and, with
        expert parallelism, the MoE dispatch counters ("moe": expert_parallel.EPStats.summary)."""
        self._send(("stats", reset))
        mine = self.stage.stats()
        if reset:
            self.stage.reset_stats()
        return gather_to_root(self.ctrl, mine)

    # -- shutdown -------------------------------------------------------------------------------
    def shutdown(self, graceful: bool = True) -> None:
        """Stop every rank and reap the local ones; idempotent."""
        if self.closed:
            return
        self.closed = True
        if graceful and not self.failed and self.ctrl is not None:
            try:
                self._send(("stop",))
                if self.chain is not None:
                    self.chain.pending.wait_all()
            except Exception:
                graceful = False
        if self.workers is not None:
            self.workers.reap(grace_s=10.0 if graceful else 0.0)
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        torch.set_num_threads(self._threads[0])
        set_num_threads(self._threads[1])
