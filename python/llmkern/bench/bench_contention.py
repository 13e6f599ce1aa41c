"""Shared cores: llmkern's throughput when another process runs on the same CPUs, as a fraction of
its throughput alone, per thread mode (LLMKERN_THREADS=pool / openmp).

    python bench/bench_contention.py [--quick] [--modes pool,openmp] [--workloads offline,decode]

Each figure comes from a fresh engine process (SmolLM2-135M, fp32 by default) that loads, warms
up, then runs the workload once while the scenario's other process is already running:

- solo: nothing else (measured before and after the other scenarios; their mean is the base);
- engine: a second llmkern engine process looping the same workload, both on all CPUs;
- split: the same two engines, each given half the CPUs with LLMKERN_CPUS (llmkern.cpu_share);
- hog: a plain CPU-bound process (a Python busy loop) pinned to one CPU.

split is also compared with the same engine alone on its half of the CPUs (solo-half), which
shows what splitting costs beyond having fewer cores (shared L3 and memory bandwidth).

Workloads are those of bench_e2e: offline-32 (32 random prompts of 32-256 tokens, 16-128 forced
greedy outputs) and batch-1 decode (128-token prompt, 128 new tokens). The ratio printed is solo
time / shared time, i.e. the fraction of solo throughput kept (target >= 0.40; a fair share of
two cores between two equal engines is 0.5). Machine load (load average) is printed with it, and
the CPU efficiency (solo CPU time per token / shared CPU time per token), which other processes on a
busy machine disturb far less; stalls and jobs run alone are the pool's counters
(llmkern._C.thread_pool_stats)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional

SUITE = "e2e"
# the workers run this module with -m: they find llmkern where this process found it
_PKG_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TARGET = 0.40
SCENARIOS = ("engine", "split", "hog")
# A plain CPU-bound process (it ends with its parent).
_HOG = "import os\np = os.getppid()\nwhile os.getppid() == p:\n    for _ in range(1 << 20): pass\n"


# ---- the engine process ---------------------------------------------------------------------
def _workload(name: str, quick: bool):
    from llmkern.bench.throughput import _workload as offline_workload

    if name == "offline":
        prompts, outs = offline_workload(8 if quick else 32)
        if quick:
            prompts, outs = [p[:96] for p in prompts], [max(8, o // 4) for o in outs]
        return prompts, outs
    import random

    rng = random.Random(2)
    return [[rng.randrange(100, 49152) for _ in range(128)]], [32 if quick else 128]


def worker(name: str, quick: bool, loop: bool, dtype: str) -> None:
    """Loads the engine, warms up, says READY, waits for a line on stdin, then runs the workload
    once and prints {"seconds", "tokens"} (or, with loop, runs it until killed)."""
    from llmkern import _C
    from llmkern.bench.throughput import _llm, _run_llmkern

    llm = _llm(dtype=dtype)
    prompts, outs = _workload(name, quick)
    _run_llmkern(llm, prompts[:2], [4] * min(2, len(prompts)))
    print("READY", flush=True)
    sys.stdin.readline()
    parent = os.getppid()
    while os.getppid() == parent:  # a looping worker ends with its driver, however that ended
        cpu0, st0 = time.process_time(), _C.thread_pool_stats()
        dt = _run_llmkern(llm, prompts, outs)
        if not loop:  # CPU time too: threads that spin while waiting burn it without progress
            st = {k: v - st0[k] for k, v in _C.thread_pool_stats().items()}
            print(json.dumps({"seconds": dt, "tokens": sum(outs), "cpu_s": time.process_time() - cpu0,
                              "threads": _C.get_num_threads(), "pool": st}), flush=True)
            return


# ---- the driver -----------------------------------------------------------------------------
def _child_env(env: Dict[str, str]) -> Dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, **env, PYTHONPATH=_PKG_PARENT + (os.pathsep + path if path else ""))


class _Proc:
    """A child process, always reaped (kill + wait) on close."""

    def __init__(self, args: List[str], env: Dict[str, str], cpus: Optional[List[int]] = None):
        def pin():
            if cpus is not None:
                os.sched_setaffinity(0, cpus)

        self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=_child_env(env), preexec_fn=pin)

    def wait_line(self, want: str, timeout: float) -> str:
        import select

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            r, _, _ = select.select([self.p.stdout], [], [], max(0.0, end - time.monotonic()))
            if not r:
                break
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError(f"contention worker exited (code {self.p.poll()}) before {want!r}")
            if line.startswith(want):
                return line
        raise TimeoutError(f"contention worker: no {want!r} within {timeout:.0f} s")

    def go(self) -> None:
        self.p.stdin.write("go\n")
        self.p.stdin.flush()

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=30)


def _engine_args(name: str, quick: bool, loop: bool, dtype: str) -> List[str]:
    a = [sys.executable, "-m", "llmkern.bench.bench_contention", "--worker", name, "--dtype", dtype]
    return a + (["--quick"] if quick else []) + (["--loop"] if loop else [])


def measure(name: str, mode: str, scenario: str, quick: bool, dtype: str = "float32",
            timeout: float = 900) -> dict:
    """{"seconds", "tokens", "cpu_s", "threads", "pool"} of one run of workload `name` under
    `scenario` (solo, solo-half: alone on cpu_share(0, 2), engine, split, hog)."""
    env = {"LLMKERN_THREADS": mode}
    cpus = sorted(os.sched_getaffinity(0))
    if scenario in ("split", "solo-half"):
        import llmkern
    procs: List[_Proc] = []
    try:
        m_env = dict(env)
        if scenario in ("split", "solo-half"):
            m_env["LLMKERN_CPUS"] = llmkern.format_cpus(llmkern.cpu_share(0, 2, cpus))
        m = _Proc(_engine_args(name, quick, False, dtype), m_env)
        procs.append(m)
        m.wait_line("READY", timeout)
        if scenario in ("engine", "split"):
            b_env = dict(env)
            if scenario == "split":
                b_env["LLMKERN_CPUS"] = llmkern.format_cpus(llmkern.cpu_share(1, 2, cpus))
            b = _Proc(_engine_args(name, quick, True, dtype), b_env)
            procs.append(b)
            b.wait_line("READY", timeout)
            b.go()
        elif scenario == "hog":
            procs.append(_Proc([sys.executable, "-c", _HOG], {}, cpus=[cpus[-1]]))
        if len(procs) > 1:
            time.sleep(0.5)  # the other process is in its steady state
        m.go()
        return json.loads(m.wait_line("{", timeout))
    finally:
        for p in reversed(procs):
            p.close()


def run(quick: bool = False, device: str = "cpu", modes=None, workloads=None, dtype: str = "float32",
        scenarios=None) -> list:
    """--quick (part of `llmkern bench e2e --quick`): the pool mode, the short offline workload,
    the engine and hog scenarios only."""
    from llmkern.bench.common import Record

    if device != "cpu":
        raise SystemExit("bench_contention: CPU only")
    modes = modes or (("pool",) if quick else ("pool", "openmp"))
    workloads = workloads or (("offline",) if quick else ("offline", "decode"))
    scenarios = scenarios or (("engine", "hog") if quick else SCENARIOS)
    recs = []
    for name in workloads:
        label = ("offline-8 (short)" if quick else "offline-32") if name == "offline" else \
            f"decode-b1 128+{32 if quick else 128}"
        for mode in modes:
            load0 = os.getloadavg()[0]
            solo = [measure(name, mode, "solo", quick, dtype)]
            shared = {s: measure(name, mode, s, quick, dtype) for s in scenarios}
            half = measure(name, mode, "solo-half", quick, dtype) if "split" in scenarios else None
            solo.append(measure(name, mode, "solo", quick, dtype))
            solo_s = sum(r["seconds"] for r in solo) / len(solo)
            tokens = solo[0]["tokens"]
            load = (load0 + os.getloadavg()[0]) / 2
            what = {"engine": "with a second llmkern engine (all CPUs)",
                    "split": "two engines, CPUs split by LLMKERN_CPUS",
                    "hog": "with a CPU-bound process on one CPU"}
            for s in scenarios:
                t = shared[s]["seconds"]
                pool = shared[s].get("pool") or {}
                solo_cpu = sum(r["cpu_s"] for r in solo) / len(solo)
                # CPU time per token, solo / shared: how much of the CPU it gets the engine turns into
                # tokens as well as alone (other processes on a shared machine move it far less than
                # wall time); the wall-time fraction is about this times the share of the CPUs it got.
                more = {"cpu_efficiency": solo_cpu / shared[s]["cpu_s"] if shared[s]["cpu_s"] else None,
                        "threads": shared[s].get("threads"), "stalls": pool.get("stalls"),
                        "solo_jobs": pool.get("solo_jobs"), "stall_wait_s": (pool.get("stall_wait_us") or 0) / 1e6,
                        "worker_chunk_share": pool.get("worker_chunks", 0) / max(1, pool.get("chunks", 0)),
                        # jobs a worker joined on the caller's CPU, and moves off it (thread_placement.h)
                        "colocated_share": pool.get("colocated", 0) / max(1, pool.get("worker_jobs", 0)),
                        "nudges": pool.get("nudges")}
                if s == "split" and half is not None:  # the fair base: the same engine alone on its half
                    more.update(fraction_of_half_solo=half["seconds"] / t, half_solo_tok_s=tokens / half["seconds"],
                                half_solo_threads=half.get("threads"))
                recs.append(Record(f"e2e/contention {label}", f"{mode}: {what[s]}", t, "same engine alone", solo_s,
                                   "out tok/s", tokens / t,
                                   extra={"fraction_of_solo": solo_s / t, "target": TARGET,
                                          "solo_runs_s": [round(r["seconds"], 3) for r in solo],
                                          "solo_tok_s": tokens / solo_s, "loadavg_1m": round(load, 2),
                                          "cpu_ms_per_token": 1e3 * shared[s]["cpu_s"] / tokens,
                                          "solo_cpu_ms_per_token": 1e3 * sum(r["cpu_s"] for r in solo) / len(solo) / tokens,
                                          "dtype": dtype, **more},
                                   axes=({"requests": 8 if quick else 32, "panel": "e2e/contention",
                                          "series": f"{mode}: {what[s]}"} if name == "offline" else {})))
                print(f"[contention] {label} {mode} {s}: {tokens / t:.1f} tok/s vs solo {tokens / solo_s:.1f} "
                      f"= {solo_s / t:.2f} of solo (load {load:.1f}); CPU ms/token "
                      f"{recs[-1].extra['cpu_ms_per_token']:.1f} vs solo {recs[-1].extra['solo_cpu_ms_per_token']:.1f} "
                      f"(CPU efficiency {more['cpu_efficiency'] or 0:.2f}); "
                      f"{more['threads']} threads, {more['stalls']} stalls ({more['stall_wait_s']:.2f} s), "
                      f"{more['solo_jobs']} jobs run alone, worker on the caller's CPU in "
                      f"{more['colocated_share']:.0%} of its jobs, {more['nudges']} nudges"
                      + (f"; vs solo on half the CPUs ({tokens / half['seconds']:.1f} tok/s, {half.get('threads')} "
                         f"threads): {more['fraction_of_half_solo']:.2f}" if "fraction_of_half_solo" in more else ""),
                      file=sys.stderr, flush=True)
    return recs


def main(argv=None) -> int:
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the finally blocks reap the children
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--modes", default="", help="pool,openmp (default: both; --quick: pool)")
    ap.add_argument("--workloads", default="", help="offline,decode (default: both; --quick: offline)")
    ap.add_argument("--scenarios", default="", help=",".join(SCENARIOS) + " (default: all; --quick: engine,hog)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--loop", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.worker, a.quick, a.loop, a.dtype)
        sys.exit(0)
    from llmkern.bench.common import print_records

    split = lambda v: tuple(x for x in v.split(",") if x) or None  # noqa: E731
    rs = run(a.quick, modes=split(a.modes), workloads=split(a.workloads), dtype=a.dtype,
             scenarios=split(a.scenarios))
    print_records(rs)
    for r in rs:
        half = r.extra.get("fraction_of_half_solo")
        print(f"  {r.bench} [{r.case}] {r.extra['fraction_of_solo']:.2f} of solo "
              f"({'meets' if r.extra['fraction_of_solo'] >= TARGET else 'below'} the {TARGET:.2f} target)"
              + (f", {half:.2f} of solo on half the CPUs" if half is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
