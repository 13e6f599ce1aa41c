"""Model parallelism on torch.distributed: tensor (Megatron-style shards of every layer),
pipeline (contiguous stages of layers) and both together, on one machine or several.

The engine's process is rank 0: it keeps the scheduler, the KV bookkeeping and the sampler, runs
its own shard, and sends each step's flat inputs to the other ranks, which only execute steps.
Ranks are laid out stage-major: rank = stage * T + tp_rank.

With pipeline parallelism the engine keeps P micro-batches in flight (engine.py: a step is
launched, and completed up to P launches later; the scheduler leaves the sequences of a step in
flight alone until it completes), so stage 0 computes the next micro-batch while the later stages
work on earlier ones. The step message travels down the pipeline with the hidden states rather
than as a broadcast (a broadcast would hold rank 0 until the busiest stage posted its receive),
and every send between stages is non-blocking.

- topology.py  ranks, stages and groups (pure arithmetic)
- sharding.py  a rank's slice of a HF-named checkpoint, as a smaller Llama
- control.py   rank 0's messages to the other ranks (setup, steps, stats, stop)
- comm.py      the collectives the parallel layers and stages use, with byte/time counters
- launch.py    process-group setup, local worker spawn, env:// (torchrun) join, reaping
- stage.py     one rank's shard of the model and its KV tiers, and its part of a step
- worker.py    a worker process: join, build its stage, run steps until told to stop
- executor.py  the engine side: start the ranks, ship each step, collect the logits, fail loudly
- spec.py      ParallelSpec: the T x P x E split, device, dtype, timeout

The engine takes a ParallelSpec (spec.py) and a kvcache.KVSpec, never the engine's own config.
Prefill-decode KV hand-over lives in llmkern.pd.
"""
from .topology import Topology

__all__ = ["Topology"]
