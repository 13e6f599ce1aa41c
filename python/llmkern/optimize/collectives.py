"""The link between two CPU ranks as llmkern's tensor/pipeline parallelism sees it: torch.distributed
(gloo) all-reduces between two local processes, timed. A ring all-reduce over two ranks moves B
bytes each way in two steps (optimize/parallel.allreduce_time), so a small message gives the
per-step latency and a large one the bandwidth."""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Tuple

SMALL, LARGE = 256, 8 << 20     # float32 elements: 1 KiB and 32 MiB


def _rank(rank: int, store: str, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        times = {}
        for n, reps in ((SMALL, 200), (LARGE, 5)):
            x = torch.ones(n)
            dist.all_reduce(x)                       # warm-up (connection, buffers)
            ts = []
            for _ in range(reps):
                dist.barrier()
                t = time.perf_counter()
                dist.all_reduce(x)
                ts.append(time.perf_counter() - t)
            times[n] = statistics.median(ts)
        if rank == 0:
            out.put(times)
    finally:
        dist.destroy_process_group()


def measure_link(timeout_s: float = 120.0) -> Tuple[float, float]:
    """(bytes/s each way, seconds per step) of a gloo all-reduce between two local processes.
    Raises RuntimeError when the processes do not finish in time (both are stopped then)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_rank, args=(r, store, out), daemon=True) for r in range(2)]
        for p in procs:
            p.start()
        try:
            times = out.get(timeout=timeout_s)
        except Exception as e:  # noqa: BLE001 - queue.Empty or a dead rank: no measurement
            raise RuntimeError(f"measuring the gloo link failed ({type(e).__name__})") from None
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
                    p.join()
    latency = times[SMALL] / 2
    return LARGE * 4 / max(times[LARGE] - 2 * latency, 1e-9), latency
