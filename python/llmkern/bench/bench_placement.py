"""Batch-1 decode in fresh processes: where the pool's threads land, and what it costs.

The scheduler places a new process's threads once and may leave the pool's worker on the calling
thread's CPU while the other CPU idles; the two then take turns on one core and that process
decodes at about the one-thread speed (a bimodal tok/s between otherwise identical processes).
This starts N fresh engine processes per placement mode (LLMKERN_THREAD_PLACEMENT, alternating
modes) and dtype, each decoding 128+`--new` tokens of SmolLM2-135M at batch 1, and prints per
process:

- tok/s (wall time; noisy on a shared machine, hence the load average beside it);
- the workers' share of the chunks (thread_pool_stats: ~1/threads when the threads run side by
  side, a few % when a worker shares the caller's core) and the share of the jobs a worker
  joined on the caller's CPU, both independent of the machine's load;
- the CPUs the caller and the workers were seen on (/proc/self/task/*/stat field 39, sampled
  every 20 ms during the decode) and the share of samples with a worker on the caller's CPU.

    python -m llmkern.bench.bench_placement [--processes 8] [--modes off,nudge]
        [--dtype float32 --dtype bfloat16] [--new 128]

nudge moves a worker only to a CPU that was mostly idle (LLMKERN_PLACEMENT_IDLE, default 0.5):
on a machine other processes keep busy it does nothing; LLMKERN_PLACEMENT_IDLE=0 in the
environment makes it move regardless.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

SUITE = "standalone"  # many processes: its own command


# ---- the engine process ---------------------------------------------------------------------
def _last_cpu(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[39 - 3])  # field 39 (processor); fields after the ')' start at 3


def pool_tids() -> list:
    """The native ids of this process's pool workers (named llmk-pool)."""
    out = []
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                if f.read().strip() == "llmk-pool":
                    out.append(int(t))
        except OSError:
            pass
    return sorted(out)


class _Sampler:
    """Samples the caller's and the workers' last CPU every `period` s on a thread of its own."""

    def __init__(self, caller: int, period: float = 0.02):
        self.caller, self.period = caller, period
        self.samples = self.same = 0
        self.caller_cpus, self.worker_cpus = set(), set()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(self.period):
            try:
                c = _last_cpu(self.caller)
                ws = [_last_cpu(t) for t in pool_tids()]
            except (OSError, IndexError, ValueError):
                continue
            self.samples += 1
            self.same += any(w == c for w in ws)
            self.caller_cpus.add(c)
            self.worker_cpus.update(ws)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def worker(dtype: str, new: int) -> None:
    """One fresh engine: warm-up, then a 128+`new` batch-1 decode; prints one JSON line."""
    import random

    import llmkern
    from llmkern import _C
    from llmkern.engine.llm import LLM
    from llmkern.engine.sampling_params import SamplingParams

    llm = LLM(dtype=dtype, kv_cache_memory_gb=0.25, quantization=None)
    eng = llm.engine
    rng = random.Random(2)
    prompt = [rng.randrange(100, 49152) for _ in range(128)]
    llm.generate([prompt], [SamplingParams(temperature=0, max_tokens=8)], use_tqdm=False)  # warm-up
    sp = SamplingParams(temperature=0, max_tokens=new, min_tokens=new, ignore_eos=True)
    eng.add_request(prompt, sp)
    eng.step()  # the prefill and the first token
    s0 = _C.thread_pool_stats()
    steps, t0 = 0, time.perf_counter()
    with _Sampler(threading.get_native_id()) as smp:
        while eng.has_unfinished_requests():
            eng.step()
            steps += 1
    dt = time.perf_counter() - t0
    st = {k: v - s0[k] for k, v in _C.thread_pool_stats().items()}
    print(json.dumps({"tok_s": steps / dt, "threads": llmkern.get_num_threads(), "pool": st,
                      "placement": llmkern.build_info().get("thread_placement"),
                      "samples": smp.samples, "same_cpu_samples": smp.same,
                      "caller_cpus": sorted(smp.caller_cpus), "worker_cpus": sorted(smp.worker_cpus),
                      "loadavg_1m": os.getloadavg()[0]}), flush=True)


# ---- the driver -----------------------------------------------------------------------------
def _one(mode: str, dtype: str, new: int, timeout: float = 600) -> dict:
    from llmkern.bench.bench_contention import _Proc

    p = _Proc([sys.executable, "-m", "llmkern.bench.bench_placement", "--worker", "--dtype", dtype,
               "--new", str(new)], {"LLMKERN_THREAD_PLACEMENT": mode})
    try:
        return json.loads(p.wait_line("{", timeout))
    finally:
        p.close()


def _row(r: dict) -> dict:
    st = r["pool"]
    return {"tok_s": r["tok_s"], "worker_share": st["worker_chunks"] / max(1, st["chunks"]),
            "colocated": st["colocated"] / max(1, st["worker_jobs"]), "nudges": st["nudges"],
            "same_cpu": r["same_cpu_samples"] / max(1, r["samples"]), "load": r["loadavg_1m"],
            "cpus": f"caller {r['caller_cpus']} workers {r['worker_cpus']}", "threads": r["threads"]}


def run(processes: int = 8, modes=("off", "nudge"), dtypes=("float32", "bfloat16"), new: int = 128) -> list:
    from llmkern.bench.common import Record

    rows = {(m, d): [] for m in modes for d in dtypes}
    for i in range(processes):
        for d in dtypes:
            for m in modes:  # alternating: the modes see the same machine load
                r = _row(_one(m, d, new))
                rows[(m, d)].append(r)
                print(f"[placement] #{i} {d:8s} {m:5s}: {r['tok_s']:6.1f} tok/s, worker share "
                      f"{r['worker_share']:.2f}, on the caller's CPU in {r['colocated']:.0%} of worker jobs "
                      f"({r['same_cpu']:.0%} of samples), {r['nudges']} nudges, {r['cpus']}, "
                      f"load {r['load']:.1f}", file=sys.stderr, flush=True)
    recs = []
    for (m, d), rs in rows.items():
        tok = [r["tok_s"] for r in rs]
        off = [r["tok_s"] for r in rows.get(("off", d), [])] if m != "off" else []
        share = [r["worker_share"] for r in rs]
        rec = Record("e2e/decode-b1 placement", f"{d} 128+{new}, LLMKERN_THREAD_PLACEMENT={m}",
                     1 / statistics.median(tok), "placement off (median, alternating)",
                     1 / statistics.median(off) if off else None, "tok/s", statistics.median(tok),
                     extra={"processes": len(rs), "tok_s_min": round(min(tok), 1), "tok_s_max": round(max(tok), 1),
                            "worker_share_min": round(min(share), 3),
                            "worker_share_median": round(statistics.median(share), 3),
                            # a worker on the caller's CPU in over a quarter of the jobs it joined:
                            # the two took turns on one core (seen with a 5% chunk share); the share
                            # also drops when other processes keep the other cores busy, so it is
                            # not the test
                            "processes_sharing_a_core": sum(r["colocated"] > 0.25 for r in rs),
                            "colocated_max": round(max(r["colocated"] for r in rs), 3),
                            "loadavg_1m": round(statistics.mean(r["load"] for r in rs), 2)})
        recs.append(rec)
    return recs


def main(argv=None) -> int:
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the finally blocks reap the children
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=8, help="fresh processes per mode and dtype")
    ap.add_argument("--modes", default="off,nudge", help="LLMKERN_THREAD_PLACEMENT values: off,nudge,bind")
    ap.add_argument("--dtype", action="append", choices=["float32", "bfloat16"], help="repeatable; default both")
    ap.add_argument("--new", type=int, default=128, help="tokens to decode per process")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.processes < 1 or a.new < 1:
        ap.error("--processes and --new must be >= 1")
    modes = tuple(m for m in a.modes.split(",") if m)
    bad = [m for m in modes if m not in ("off", "nudge", "bind")]
    if bad or not modes:
        ap.error(f"--modes: expected values among off,nudge,bind, got {a.modes!r}")
    if a.worker:
        worker((a.dtype or ["float32"])[0], a.new)
        return 0
    from llmkern.bench.common import print_records

    rs = run(a.processes, modes, tuple(a.dtype or ("float32", "bfloat16")), a.new)
    print_records(rs)
    for r in rs:
        e = r.extra
        print(f"  {r.case}: median {r.llmkern_value:.1f} tok/s (min {e['tok_s_min']}, max {e['tok_s_max']}), worker share "
              f"min {e['worker_share_min']:.2f} / median {e['worker_share_median']:.2f}, "
              f"{e['processes_sharing_a_core']} of {e['processes']} processes with the threads on one core "
              f"(load {e['loadavg_1m']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
