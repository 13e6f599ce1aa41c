"""Batch-1 decode against its weight-bandwidth bound, with the per-op split of a token's time.

SmolLM2-135M, a 128-token prompt then `--new` greedy tokens, per dtype. A decode step reads every
weight once, so its floor is weight bytes per token / read bandwidth (a sum over a 256 MiB buffer,
measured in the same run with the same thread count). Reported: tok/s, that bound, the fraction
reached, and where a token's time goes: each llmkern kernel (the extension calls), torch ops, and
the rest (Python: scheduler, sampler bookkeeping), from cProfile's per-function totals over the
decode steps of a separate, profiled run (which the profiler's own cost slows down); and, from
one more run with the one-call step's own timers, where the step's time goes: the norms, each
projection and the attention call.

With `--threads 1` the times are the calling thread's CPU time, which other processes on a shared
machine disturb far less than wall time (the bound is then the one-thread bandwidth, also in CPU
time).

    python -m llmkern.bench.bench_decode_profile [--quick] [--dtype bfloat16] [--threads 1]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import time

SUITE = "e2e"


def _bandwidth(cpu_time: bool) -> float:
    """The decode benches' read bandwidth (on huge pages, as the weights are); cpu_time: in the
    thread's CPU time (one-thread runs)."""
    from llmkern.bench.common import stream_read_rate

    return stream_read_rate(64 << 20, 7, 4, time.thread_time if cpu_time else time.perf_counter)


def _split(prof: cProfile.Profile, steps: int) -> list:
    """[(name, ms per token)] of the biggest self times: extension calls by name, the rest grouped."""
    st = pstats.Stats(prof).stats
    ext, torch_ms, total = {}, 0.0, 0.0
    for (file, _line, fn), (_cc, _nc, tt, _ct, _callers) in st.items():
        ms = 1e3 * tt / steps
        total += ms
        if file == "~" and "llmkern._C" in fn:
            ext[fn.split(".")[-1].rstrip(">").strip("'}")] = ext.get(fn, 0.0) + ms
        elif file == "~" and ("torch" in fn or "Tensor" in fn):
            torch_ms += ms
    rows = sorted(ext.items(), key=lambda kv: -kv[1])
    rows.append(("torch ops", torch_ms))
    rows.append(("Python and the rest", total - sum(ext.values()) - torch_ms))
    return rows


def _step_phases(model, decode) -> dict:
    """{phase: ms per token} inside the one-call decode step over one more run, from the step's own
    timers (ops/decoder.py: DecodeStepCpu.profile); {} where the model has no such step."""
    step = model.decode_step()
    if step is None:
        return {}
    step.impl.set_profiling(True)
    try:
        decode()
        prof = step.impl.profile()
    finally:
        step.impl.set_profiling(False)
    n = max(1, prof["steps"])
    return {k: 1e3 * v / n for k, v in prof["seconds"].items()}


def batch1_setup(name: str, device: str, threads: int, quick: bool, new_tokens: int):
    """The batch-1 benches' common setup: CPU only, the thread count applied to llmkern and torch;
    returns (cpu_time, clock, tokens to decode, the 128-token prompt). One thread: the calling
    thread's CPU time (see the module docstring)."""
    import llmkern
    import torch

    if device != "cpu":
        raise SystemExit(f"{name}: CPU only")
    if threads:
        llmkern.set_num_threads(threads)
        torch.set_num_threads(threads)
    cpu_time = threads == 1
    rng = random.Random(2)
    prompt = [rng.randrange(100, 49152) for _ in range(128)]
    return cpu_time, time.thread_time if cpu_time else time.perf_counter, new_tokens or (16 if quick else 128), prompt


def run(quick: bool = False, device: str = "cpu", dtypes=("float32", "bfloat16"), threads: int = 0,
        new_tokens: int = 0) -> list:
    import llmkern
    from llmkern.bench.common import Record
    from llmkern.engine.llm import LLM
    from llmkern.engine.sampling_params import SamplingParams

    cpu_time, clock, n_new, prompt = batch1_setup("bench_decode_profile", device, threads, quick, new_tokens)
    recs = []
    for dt in dtypes:
        llm = LLM(dtype=dt, kv_cache_memory_gb=0.25, quantization=None)
        eng = llm.engine
        wbytes = eng.model.weight_bytes
        sp = SamplingParams(temperature=0, max_tokens=n_new, min_tokens=n_new, ignore_eos=True)
        llm.generate([prompt], [SamplingParams(temperature=0, max_tokens=4)], use_tqdm=False)  # warm-up
        def decode(prof=None):
            eng.add_request(prompt, sp)
            eng.step()  # the prefill and the first token
            steps, t0 = 0, clock()
            if prof:
                prof.enable()
            while eng.has_unfinished_requests():
                eng.step()
                steps += 1
            if prof:
                prof.disable()
            return (clock() - t0) / steps, steps

        best = min(decode()[0] for _ in range(2 if quick else 3))
        prof = cProfile.Profile(clock)  # a separate run: the profiler's own cost stays out of `best`
        prof_tok, steps = decode(prof)
        phases = _step_phases(eng.model, decode)
        bw = _bandwidth(cpu_time)
        bound = wbytes / bw
        split = _split(prof, steps)
        recs.append(Record("e2e/decode-b1 vs weight bandwidth", f"{dt} 128+{n_new}, {llmkern.get_num_threads()} thread(s)"
                           + (" (CPU time)" if cpu_time else ""), best, "weight-read bound", bound, "tok/s",
                           1 / best, 1 / bound,
                           extra={"weight_mb": round(wbytes / 1e6, 1), "read_gb_s": round(bw / 1e9, 1),
                                  "fraction_of_bound": round(bound / best, 3),
                                  "profiled_ms_per_token": round(1e3 * prof_tok, 3),
                                  "ms_per_token_split": {k: round(v, 3) for k, v in split if v >= 0.005},
                                  "step_phase_ms_per_token": {k: round(v, 3) for k, v in phases.items()}}))
        print(f"[decode-profile] {dt}: {1e3 * best:.2f} ms/token, bound {1e3 * bound:.2f} ms "
              f"({wbytes / 1e6:.0f} MB at {bw / 1e9:.1f} GB/s) = {bound / best:.2f} of the bound", file=sys.stderr)
        print(f"    per-op split of a profiled run ({1e3 * prof_tok:.2f} ms/token with the profiler's cost):",
              file=sys.stderr)
        for k, v in split:
            if v >= 0.005:
                print(f"    {k:28s} {v:7.3f} ms/token", file=sys.stderr)
        if phases:
            print("    inside the one-call step (its own timers, another run): "
                  + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()) + " ms/token", file=sys.stderr)
        del llm, eng
    return recs


def main(argv=None) -> int:
    from llmkern.bench.common import print_records

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dtype", action="append", choices=["float32", "bfloat16"],
                    help="repeatable; default both")
    ap.add_argument("--threads", type=int, default=0, help="0 = llmkern's default")
    ap.add_argument("--new", type=int, default=0, help="tokens to decode (default 128, 16 with --quick)")
    args = ap.parse_args(argv)
    print_records(run(args.quick, dtypes=tuple(args.dtype or ("float32", "bfloat16")), threads=args.threads,
                      new_tokens=args.new))
    return 0


if __name__ == "__main__":
    sys.exit(main())
