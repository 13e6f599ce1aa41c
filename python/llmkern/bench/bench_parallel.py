"""Tensor parallelism on one CPU machine: SmolLM2-135M (fp32), T=2 (two ranks, one thread each)
against T=1 (one process, two threads), both engines alive in the same run and their
measurements alternated, so load from other jobs on the machine affects both alike.

    python bench/bench_parallel.py [--quick] [--rounds 2]

Workloads: batch-1 decode (one prompt; decode tokens/s from first to last token) and offline-32
(32 prompts at once; output tokens/s). For T=2 also:
  - bytes per generated token: computed from the model's shape (the all-reduces of the
    row-parallel projections and the embedding, the logits gather) and measured twice -- the
    payload counted by llmkern.distributed's collectives, and every byte each rank process wrote
    through system calls (/proc/PID/io wchar: gloo's sockets, the step messages, everything);
  - time in collectives per engine step on each rank (gloo runs them synchronously, so this is
    time the rank spent in communication, waiting for its peer included).
The fraction column is decode's weight stream against the machine's measured read bandwidth.

Pipeline parallelism (P=2, one thread per stage) runs offline-32 twice, alternated: with two
micro-batches in flight (the default: while stage 1 works on one, stage 0 computes the next) and
with one (each step crosses both stages before the next starts, so each stage idles half the
time). Batch-1 decode cannot overlap (one sequence, each token needs the previous one).

Run as a script, this sets OMP_WAIT_POLICY=PASSIVE (unless set) before torch loads (see
bench_spec.py: spinning OpenMP threads on a shared CPU measure the machine's load)."""
from __future__ import annotations

SUITE = "standalone"  # several processes / long workloads: run by its own command only

import argparse
import os
import sys
import time

if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import llmkern  # noqa: E402
from llmkern import LLM, SamplingParams  # noqa: E402

PROMPTS = ["Write a short story about a lighthouse keeper.", "Explain how a bicycle works.",
           "List five facts about the moon.", "What is the capital of France and why?"]


def set_threads(n: int) -> None:
    torch.set_num_threads(n)
    llmkern.set_num_threads(n)


def decode_rate(llm, n_tokens: int) -> float:
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=n_tokens, ignore_eos=True),
                       use_tqdm=False)[0]
    m = out.metrics
    return (m.num_output_tokens - 1) / (m.e2e - m.ttft)


def offline_rate(llm, n_req: int, n_tokens: int) -> float:
    prompts = [PROMPTS[i % len(PROMPTS)] + f" ({i})" for i in range(n_req)]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n_tokens, ignore_eos=True), use_tqdm=False)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)


def computed_bytes_per_token(cfg, T: int) -> dict:
    """Per generated token of a decode step (one row per sequence), per rank: all-reduce payload
    of the 2 row-parallel outputs per layer + the embedding ([hidden] fp32 each; a 2-rank ring
    all-reduce sends and receives the payload once), and the logits shard a non-root rank sends."""
    ar = (2 * cfg.num_layers + 1) * cfg.hidden_size * 4
    vshard = -(-cfg.vocab_size // T) * 4
    return {"all_reduce": ar, "gather": vshard, "rank1_total": ar + vshard}


def measure_t2(llm, fn) -> dict:
    ex = llm.engine.executor
    ex.stats(reset=True)
    before = ex.stats(reset=True)
    steps0, toks0 = llm.engine.metrics.steps, llm.engine.metrics.output_tokens
    rate = fn()
    after = ex.stats(reset=True)
    steps = llm.engine.metrics.steps - steps0
    toks = llm.engine.metrics.output_tokens - toks0
    per_rank = []
    for b, a in zip(before, after):
        per_rank.append({"us_per_call": {k: 1e6 * a["comm"]["seconds"][k] / n for k, n in a["comm"]["calls"].items()},
                         "calls_per_step": sum(a["comm"]["calls"].values()) / steps,
                         "payload_per_tok": a["comm"]["total_bytes"] / toks,
                         "io_per_tok": (a["io_bytes"] - b["io_bytes"]) / toks if a["io_bytes"] is not None else None,
                         "coll_ms_per_step": 1e3 * a["comm"]["total_seconds"] / steps,
                         "kinds": a["comm"]["bytes"]})
    return {"rate": rate, "steps": steps, "tokens": toks, "ranks": per_rank}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-pipeline", action="store_true", help="skip the pipeline-parallel rows")
    a = ap.parse_args(argv)
    n_dec = 32 if a.quick else 96
    n_req, n_off = 32, (16 if a.quick else 32)
    load0 = os.getloadavg()

    from llmkern.bench.common import read_bandwidth

    bw = read_bandwidth()
    set_threads(2)
    t1 = LLM(kv_cache_memory_gb=0.5, quantization=None)  # as the TP ranks load it: dequantised
    cfg = t1.engine.model_config
    weight_bytes = t1.engine.model.weight_bytes
    t2 = LLM(tensor_parallel_size=2, kv_cache_memory_gb=0.25)
    try:
        results = {"t1_dec": [], "t2_dec": [], "t1_off": [], "t2_off": []}
        set_threads(2)
        decode_rate(t1, 8)  # warm-up
        set_threads(1)
        decode_rate(t2, 8)
        m_dec = m_off = None
        for _ in range(a.rounds):
            set_threads(2)
            results["t1_dec"].append(decode_rate(t1, n_dec))
            set_threads(1)
            m_dec = measure_t2(t2, lambda: decode_rate(t2, n_dec))
            results["t2_dec"].append(m_dec["rate"])
            set_threads(2)
            results["t1_off"].append(offline_rate(t1, n_req, n_off))
            set_threads(1)
            m_off = measure_t2(t2, lambda: offline_rate(t2, n_req, n_off))
            results["t2_off"].append(m_off["rate"])
    finally:
        t2.shutdown()
    pipe = None if a.no_pipeline else pipeline_rates(a.rounds, n_req, n_off)
    load1 = os.getloadavg()

    best = {k: max(v) for k, v in results.items()}
    comp = computed_bytes_per_token(cfg, 2)
    print(f"SmolLM2-135M fp32, CPU, {os.cpu_count()} cores; load average {load0[0]:.1f} before, {load1[0]:.1f} "
          f"after (a shared machine: best of {a.rounds} alternated rounds)")
    print(f"read bandwidth {bw / 1e9:.1f} GB/s; weights {weight_bytes / 1e6:.0f} MB (T=2: about half per rank)")
    print()
    print(f"{'workload':<22}{'T=1 (2 thr)':>14}{'T=2 (1 thr/rank)':>18}{'T2/T1':>8}{'T=1 BW frac':>13}")
    for name, k, unit in (("batch-1 decode", "dec", "tok/s"), (f"offline-{n_req}", "off", "tok/s")):
        r1, r2 = best[f"t1_{k}"], best[f"t2_{k}"]
        frac = f"{r1 * weight_bytes / bw:.2f}" if k == "dec" else "-"
        print(f"{name:<22}{r1:>10.1f} {unit}{r2:>14.1f} {unit}{r2 / r1:>8.2f}{frac:>13}")
    print()
    print("T=2 communication per generated token (KB) and time in collectives per step (ms):")
    print(f"{'':<22}{'computed':>10}{'rank0 payload':>15}{'rank1 payload':>15}{'rank0 io':>10}{'rank1 io':>10}"
          f"{'rank0 ms':>10}{'rank1 ms':>10}")
    for name, m in (("batch-1 decode", m_dec), (f"offline-{n_req}", m_off)):
        r0, r1 = m["ranks"]
        print(f"{name:<22}{comp['rank1_total'] / 1e3:>10.1f}{r0['payload_per_tok'] / 1e3:>15.1f}"
              f"{r1['payload_per_tok'] / 1e3:>15.1f}{(r0['io_per_tok'] or 0) / 1e3:>10.1f}"
              f"{(r1['io_per_tok'] or 0) / 1e3:>10.1f}{r0['coll_ms_per_step']:>10.2f}{r1['coll_ms_per_step']:>10.2f}")
    print(f"(computed, per token, rank 1: all-reduce {comp['all_reduce'] / 1e3:.1f} KB + logits shard "
          f"{comp['gather'] / 1e3:.1f} KB; rank 0 sends the all-reduce share and the step message instead of logits)")
    for name, m in (("batch-1 decode", m_dec), (f"offline-{n_req}", m_off)):
        r0 = m["ranks"][0]
        per = ", ".join(f"{k} {v:.0f} us" for k, v in r0["us_per_call"].items())
        print(f"{name}: {r0['calls_per_step']:.0f} collectives per step on rank 0, mean time per call: {per}")
    if pipe is not None:
        r2, r1 = max(pipe[2]), max(pipe[1])
        print()
        print(f"P=2 (1 thread/stage), offline-{n_req}: 2 micro-batches in flight {r2:.1f} tok/s, 1 in flight "
              f"{r1:.1f} tok/s: x{r2 / r1:.2f}; against T=1 (2 threads) x{r2 / best['t1_off']:.2f}")
    return 0


def pipeline_rates(rounds: int, n_req: int, n_tokens: int) -> dict:
    """offline rates of P=2 with 2 and with 1 micro-batch in flight, alternated on one engine
    (one model-parallel engine per process)."""
    set_threads(1)
    llm = LLM(pipeline_parallel_size=2, kv_cache_memory_gb=0.25)
    try:
        out = {2: [], 1: []}
        offline_rate(llm, 4, 4)  # warm-up
        for _ in range(rounds):
            for mb in out:
                llm.engine.pipeline_depth = mb
                out[mb].append(offline_rate(llm, n_req, n_tokens))
        return out
    finally:
        llm.shutdown()


if __name__ == "__main__":
    sys.exit(main())
